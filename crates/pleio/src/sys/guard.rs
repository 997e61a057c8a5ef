//! Copies out of file mappings that survive `SIGBUS`.
//!
//! Reading a mapped file page the file no longer holds (it was truncated,
//! shrunk, or rewritten in place with `O_TRUNC`), or a page the device
//! cannot read (an I/O error), raises `SIGBUS`, whose default action kills
//! the process. pleio copies row bytes out of its mappings with one small
//! assembly routine, [`copy_rows`], and installs (once, on first use) a
//! `SIGBUS` handler that recognizes a fault inside that routine by the
//! faulting instruction's address: it sets the routine's return registers
//! (rows copied so far, faulting address) and resumes at the routine's
//! exit. The routine then returns an error instead of the process dying.
//! Nothing unwinds through foreign frames and no state is shared: the saved
//! instruction pointer alone decides, so it is exact for any number of
//! threads. A `SIGBUS` anywhere else goes to the handler that was installed
//! before pleio's (Rust's own, whose default is to die as before).
//!
//! The routine copies with 32-byte AVX moves (16-byte SSE2 moves on a CPU
//! without AVX), so a 90-byte row costs three loads and stores; the caller
//! decodes from the copy, never from the mapping, so a fault leaves its
//! output untouched.
//!
//! Available on Linux x86_64 ([`PROTECTED`]). Elsewhere [`copy_rows`] is a
//! plain copy and a shrinking file still raises `SIGBUS`.

/// True where [`copy_rows`] survives `SIGBUS` (Linux x86_64).
pub const PROTECTED: bool = imp::PROTECTED;

/// A mapped copy that stopped at an unreadable byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyFault {
    /// Index (in the `rows` given) of the row being copied.
    pub index: usize,
    /// Address whose read raised `SIGBUS`.
    pub addr: usize,
}

/// Copies `row_bytes` bytes from `base + rows[i] * row_bytes` to
/// `dst[i * row_bytes..]` for every `i`, in order. A read that raises
/// `SIGBUS` stops the copy: `Err` names the row and the address. `dst`
/// then holds the rows before it and unspecified bytes in its slot.
///
/// # Safety
///
/// `dst` holds at least `rows.len() * row_bytes` bytes (no overflow), and
/// every source range lies inside one live read-only mapping of a file:
/// readable memory, except for pages the file no longer backs.
pub(crate) unsafe fn copy_rows(
    dst: &mut [u8],
    base: *const u8,
    rows: &[u64],
    row_bytes: usize,
) -> Result<(), CopyFault> {
    debug_assert!(rows
        .len()
        .checked_mul(row_bytes)
        .is_some_and(|n| n <= dst.len()));
    // SAFETY: forwarded from the caller.
    unsafe { imp::copy_rows(dst, base, rows, row_bytes) }
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
mod imp {
    use std::ffi::c_void;
    use std::sync::OnceLock;

    use super::CopyFault;

    pub(super) const PROTECTED: bool = true;

    // pleio_guarded_copy_rows(dst: rdi, base: rsi, rows: rdx, n: rcx,
    //                         row_bytes: r8) -> (rax: rows copied, rdx: 0)
    //
    // Row `r9` is copied from `r10` to `rdi`, `r11` bytes left. Only the
    // loads from `r10`/`rax` can fault; the handler then sets rdx to the
    // faulting address and rip to pleio_guarded_copy_fault, which returns
    // (rax: r9, the row that faulted; rdx: the address). Caller-saved
    // registers only (rax, rcx, rdx, rsi, rdi, r8-r11, xmm0); no stack.
    std::arch::global_asm!(
        ".pushsection .text.pleio_guarded_copy,\"ax\",@progbits",
        ".p2align 4",
        ".globl pleio_guarded_copy_rows",
        ".hidden pleio_guarded_copy_rows",
        ".type pleio_guarded_copy_rows,@function",
        "pleio_guarded_copy_rows:",
        "    xor r9d, r9d",
        "20:",
        "    cmp r9, rcx",
        "    jae 29f",
        "    mov r10, qword ptr [rdx + 8*r9]",
        "    imul r10, r8",
        "    add r10, rsi",
        "    mov r11, r8",
        "    cmp r11, 16",
        "    jb 25f",
        // 16 bytes or more: whole 16-byte chunks, then the last 16 bytes
        // of the row once more (overlapping) for a ragged tail.
        "    lea rax, [r10 + r11 - 16]",
        "22:",
        "    movdqu xmm0, xmmword ptr [r10]",
        "    movdqu xmmword ptr [rdi], xmm0",
        "    add r10, 16",
        "    add rdi, 16",
        "    sub r11, 16",
        "    cmp r11, 16",
        "    jae 22b",
        "    test r11, r11",
        "    jz 24f",
        "    movdqu xmm0, xmmword ptr [rax]",
        "    movdqu xmmword ptr [rdi + r11 - 16], xmm0",
        "    add rdi, r11",
        "24:",
        "    inc r9",
        "    jmp 20b",
        // Fewer than 16 bytes: byte by byte.
        "25:",
        "    test r11, r11",
        "    jz 24b",
        "26:",
        "    mov al, byte ptr [r10]",
        "    mov byte ptr [rdi], al",
        "    inc r10",
        "    inc rdi",
        "    dec r11",
        "    jnz 26b",
        "    jmp 24b",
        "29:",
        "    mov rax, r9",
        "    xor edx, edx",
        "    ret",
        ".size pleio_guarded_copy_rows, . - pleio_guarded_copy_rows",
        ".globl pleio_guarded_copy_fault",
        ".hidden pleio_guarded_copy_fault",
        ".type pleio_guarded_copy_fault,@function",
        "pleio_guarded_copy_fault:",
        "    mov rax, r9",
        "    ret",
        ".size pleio_guarded_copy_fault, . - pleio_guarded_copy_fault",
        ".popsection",
    );

    // The same with 32-byte AVX moves where the CPU has them (a 90-byte
    // row: three loads and stores instead of six), VEX-encoded throughout
    // and `vzeroupper` on both ways out. Its own landing, for the
    // `vzeroupper`, which the SSE2 routine's CPU may not have.
    std::arch::global_asm!(
        ".pushsection .text.pleio_guarded_copy,\"ax\",@progbits",
        ".p2align 4",
        ".globl pleio_guarded_copy_rows_avx",
        ".hidden pleio_guarded_copy_rows_avx",
        ".type pleio_guarded_copy_rows_avx,@function",
        "pleio_guarded_copy_rows_avx:",
        "    xor r9d, r9d",
        "30:",
        "    cmp r9, rcx",
        "    jae 39f",
        "    mov r10, qword ptr [rdx + 8*r9]",
        "    imul r10, r8",
        "    add r10, rsi",
        "    mov r11, r8",
        "    cmp r11, 32",
        "    jb 35f",
        "    lea rax, [r10 + r11 - 32]",
        "32:",
        "    vmovdqu ymm0, ymmword ptr [r10]",
        "    vmovdqu ymmword ptr [rdi], ymm0",
        "    add r10, 32",
        "    add rdi, 32",
        "    sub r11, 32",
        "    cmp r11, 32",
        "    jae 32b",
        "    test r11, r11",
        "    jz 34f",
        "    vmovdqu ymm0, ymmword ptr [rax]",
        "    vmovdqu ymmword ptr [rdi + r11 - 32], ymm0",
        "    add rdi, r11",
        "34:",
        "    inc r9",
        "    jmp 30b",
        // 16 to 31 bytes: two overlapping 16-byte moves.
        "35:",
        "    cmp r11, 16",
        "    jb 36f",
        "    vmovdqu xmm0, xmmword ptr [r10]",
        "    vmovdqu xmm1, xmmword ptr [r10 + r11 - 16]",
        "    vmovdqu xmmword ptr [rdi], xmm0",
        "    vmovdqu xmmword ptr [rdi + r11 - 16], xmm1",
        "    add rdi, r11",
        "    jmp 34b",
        // Fewer than 16 bytes: byte by byte.
        "36:",
        "    test r11, r11",
        "    jz 34b",
        "37:",
        "    mov al, byte ptr [r10]",
        "    mov byte ptr [rdi], al",
        "    inc r10",
        "    inc rdi",
        "    dec r11",
        "    jnz 37b",
        "    jmp 34b",
        "39:",
        "    vzeroupper",
        "    mov rax, r9",
        "    xor edx, edx",
        "    ret",
        ".size pleio_guarded_copy_rows_avx, . - pleio_guarded_copy_rows_avx",
        ".globl pleio_guarded_copy_fault_avx",
        ".hidden pleio_guarded_copy_fault_avx",
        ".type pleio_guarded_copy_fault_avx,@function",
        "pleio_guarded_copy_fault_avx:",
        "    vzeroupper",
        "    mov rax, r9",
        "    ret",
        ".size pleio_guarded_copy_fault_avx, . - pleio_guarded_copy_fault_avx",
        ".popsection",
    );

    /// The routine's two return registers (SysV: a 16-byte struct of two
    /// integers comes back in rax and rdx).
    #[repr(C)]
    struct Copied {
        rows: usize,
        fault_addr: usize,
    }

    extern "sysv64" {
        fn pleio_guarded_copy_rows(
            dst: *mut u8,
            base: *const u8,
            rows: *const u64,
            n: usize,
            row_bytes: usize,
        ) -> Copied;
        fn pleio_guarded_copy_fault();
        fn pleio_guarded_copy_rows_avx(
            dst: *mut u8,
            base: *const u8,
            rows: *const u64,
            n: usize,
            row_bytes: usize,
        ) -> Copied;
        fn pleio_guarded_copy_fault_avx();
    }

    /// The handler that was installed before ours (what a `SIGBUS` outside
    /// the routine is handed to).
    static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

    /// Whether our handler is installed (decided once).
    static INSTALLED: OnceLock<bool> = OnceLock::new();

    /// Installs the handler once; false if the OS refused.
    fn install() -> bool {
        *INSTALLED.get_or_init(|| {
            // SAFETY: sigaction with a null new action only reads the
            // current one into `prev`, plain data we own.
            let prev = unsafe {
                let mut prev: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut prev) != 0 {
                    return false;
                }
                prev
            };
            if PREVIOUS.set(prev).is_err() {
                return false;
            }
            // SAFETY: installs `on_sigbus`, an async-signal-safe handler
            // (it reads two addresses and a `OnceLock`, writes the
            // interrupted context, or calls the previous handler or
            // sigaction/raise, all async-signal-safe). SA_ONSTACK keeps
            // Rust's alternate signal stack usable for the chained handler.
            unsafe {
                let mut act: libc::sigaction = std::mem::zeroed();
                act.sa_sigaction = on_sigbus as *const () as usize;
                act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                libc::sigemptyset(&mut act.sa_mask);
                libc::sigaction(libc::SIGBUS, &act, std::ptr::null_mut()) == 0
            }
        })
    }

    unsafe extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
        let routines = [
            (
                pleio_guarded_copy_rows as *const () as usize,
                pleio_guarded_copy_fault as *const () as usize,
            ),
            (
                pleio_guarded_copy_rows_avx as *const () as usize,
                pleio_guarded_copy_fault_avx as *const () as usize,
            ),
        ];
        // SAFETY: the kernel passes a valid ucontext_t for an SA_SIGINFO
        // handler; it is ours to read and modify until we return.
        let gregs = unsafe { &mut (*ctx.cast::<libc::ucontext_t>()).uc_mcontext.gregs };
        let rip = gregs[libc::REG_RIP as usize] as usize;
        let ours = routines
            .iter()
            .find(|(start, landing)| (*start..*landing).contains(&rip));
        if let Some(&(_, landing)) = ours {
            // A load of the copy routine faulted: resume at its landing,
            // which returns the row index (r9, intact) and rdx.
            // SAFETY: `info` is the kernel's valid siginfo for this signal.
            let addr = unsafe { (*info).si_addr() } as usize;
            gregs[libc::REG_RDX as usize] = addr as i64;
            gregs[libc::REG_RIP as usize] = landing as i64;
            return;
        }
        // SAFETY: forwarding the kernel's own arguments.
        unsafe { chain(sig, info, ctx) }
    }

    /// Hands a `SIGBUS` that is not ours to the previous disposition.
    unsafe fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
        let prev = PREVIOUS.get();
        let handler = prev.map_or(libc::SIG_DFL, |p| p.sa_sigaction);
        // SAFETY: `info` is the kernel's valid siginfo.
        let sent = unsafe { (*info).si_code } <= 0;
        if handler == libc::SIG_IGN {
            if sent {
                return; // kill(2) of an ignored signal: ignore it.
            }
        } else if handler != libc::SIG_DFL {
            let siginfo = prev.is_some_and(|p| p.sa_flags & libc::SA_SIGINFO != 0);
            // SAFETY: `handler` is the function pointer the previous
            // sigaction installed, with the signature its flags declare.
            unsafe {
                if siginfo {
                    let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut c_void) =
                        std::mem::transmute(handler);
                    f(sig, info, ctx);
                } else {
                    let f: extern "C" fn(libc::c_int) = std::mem::transmute(handler);
                    f(sig);
                }
            }
            return;
        }
        // Default action: restore it; a fault then recurs on return and
        // kills the process as it would have without pleio, and a signal
        // sent with kill(2) is raised again.
        // SAFETY: sigaction and raise are async-signal-safe; `dfl` is a
        // plain default disposition.
        unsafe {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            libc::sigemptyset(&mut dfl.sa_mask);
            libc::sigaction(sig, &dfl, std::ptr::null_mut());
            if sent {
                libc::raise(sig);
            }
        }
    }

    pub(super) unsafe fn copy_rows(
        dst: &mut [u8],
        base: *const u8,
        rows: &[u64],
        row_bytes: usize,
    ) -> Result<(), CopyFault> {
        let avx = std::arch::is_x86_feature_detected!("avx");
        // SAFETY: forwarded from the caller.
        unsafe { copy_rows_with(avx, dst, base, rows, row_bytes) }
    }

    /// [`copy_rows`] with the AVX routine (`avx`, which the CPU must have)
    /// or the SSE2 one.
    pub(super) unsafe fn copy_rows_with(
        avx: bool,
        dst: &mut [u8],
        base: *const u8,
        rows: &[u64],
        row_bytes: usize,
    ) -> Result<(), CopyFault> {
        if rows.is_empty() || row_bytes == 0 {
            return Ok(());
        }
        if !install() {
            // No handler: a plain copy (a fault kills, as before pleio).
            // SAFETY: forwarded from the caller.
            unsafe { super::plain_copy(dst, base, rows, row_bytes) };
            return Ok(());
        }
        // SAFETY: the caller guarantees `dst` has room for every row and
        // every source range is inside a live mapping (and the CPU has AVX
        // if `avx`); the routine reads only those ranges and `rows`, writes
        // only `dst`, and a SIGBUS in it is turned into a return by
        // `on_sigbus`.
        let done = unsafe {
            let copy = if avx {
                pleio_guarded_copy_rows_avx
            } else {
                pleio_guarded_copy_rows
            };
            copy(dst.as_mut_ptr(), base, rows.as_ptr(), rows.len(), row_bytes)
        };
        if done.rows >= rows.len() {
            Ok(())
        } else {
            Err(CopyFault {
                index: done.rows,
                addr: done.fault_addr,
            })
        }
    }
}

#[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
mod imp {
    use super::CopyFault;

    pub(super) const PROTECTED: bool = false;

    pub(super) unsafe fn copy_rows(
        dst: &mut [u8],
        base: *const u8,
        rows: &[u64],
        row_bytes: usize,
    ) -> Result<(), CopyFault> {
        // SAFETY: forwarded from the caller.
        unsafe { super::plain_copy(dst, base, rows, row_bytes) };
        Ok(())
    }
}

/// The unprotected copy: what [`copy_rows`] does where no handler exists.
///
/// # Safety
///
/// As for [`copy_rows`]; a fault here raises `SIGBUS`.
#[allow(dead_code)]
unsafe fn plain_copy(dst: &mut [u8], base: *const u8, rows: &[u64], row_bytes: usize) {
    for (&row, slot) in rows.iter().zip(dst.chunks_exact_mut(row_bytes)) {
        // SAFETY: the caller guarantees the source range is mapped and
        // readable and `slot` is `row_bytes` long.
        let src =
            unsafe { std::slice::from_raw_parts(base.add(row as usize * row_bytes), row_bytes) };
        slot.copy_from_slice(src);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    /// A temp file of `pages` pages, mapped read-only and shared.
    struct Mapped {
        file: std::fs::File,
        ptr: *const u8,
        len: usize,
    }

    impl Mapped {
        fn new(pages: usize) -> Mapped {
            let page = crate::sys::page_size() as usize;
            let len = pages * page;
            let mut file = tempfile::tempfile().unwrap();
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            file.write_all(&data).unwrap();
            // SAFETY: a fresh read-only shared mapping of our own file.
            let ptr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ,
                    libc::MAP_SHARED,
                    file.as_raw_fd(),
                    0,
                )
            };
            assert_ne!(ptr, libc::MAP_FAILED);
            Mapped {
                file,
                ptr: ptr.cast(),
                len,
            }
        }
    }

    impl Drop for Mapped {
        fn drop(&mut self) {
            // SAFETY: unmapping what `new` mapped; nothing borrows it.
            unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
        }
    }

    /// Every copy routine this CPU can run: (name, copy).
    type CopyFn = unsafe fn(&mut [u8], *const u8, &[u64], usize) -> Result<(), CopyFault>;
    fn routines() -> Vec<(&'static str, CopyFn)> {
        #[allow(unused_mut)]
        let mut v: Vec<(&'static str, CopyFn)> = vec![("default", copy_rows)];
        #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
        {
            // SAFETY (of the closures): forwarded; AVX only where detected.
            v.push(("sse2", |d, b, r, n| unsafe {
                imp::copy_rows_with(false, d, b, r, n)
            }));
            if std::arch::is_x86_feature_detected!("avx") {
                v.push(("avx", |d, b, r, n| unsafe {
                    imp::copy_rows_with(true, d, b, r, n)
                }));
            }
        }
        v
    }

    #[test]
    fn copies_rows_of_every_width() {
        let m = Mapped::new(4);
        for (name, copy) in routines() {
            for rb in [
                1usize, 7, 15, 16, 17, 31, 32, 33, 63, 64, 90, 160, 256, 4097,
            ] {
                copies_rows(&m, name, copy, rb);
            }
        }
    }

    fn copies_rows(m: &Mapped, name: &str, copy: CopyFn, rb: usize) {
        {
            let n_rows = (m.len / rb) as u64;
            let rows: Vec<u64> = vec![0, n_rows - 1, 3 % n_rows, 1 % n_rows, n_rows / 2];
            let mut dst = vec![0xAAu8; rows.len() * rb + 5];
            // SAFETY: every row is inside the mapping; dst has room.
            unsafe { copy(&mut dst, m.ptr, &rows, rb) }.unwrap();
            for (i, &r) in rows.iter().enumerate() {
                let want: Vec<u8> = (0..rb)
                    .map(|k| ((r as usize * rb + k) % 251) as u8)
                    .collect();
                assert_eq!(
                    &dst[i * rb..(i + 1) * rb],
                    &want[..],
                    "{name}: row {r} of {rb} bytes"
                );
            }
            assert!(
                dst[rows.len() * rb..].iter().all(|&b| b == 0xAA),
                "{name} {rb}: wrote past the rows"
            );
        }
    }

    #[test]
    fn a_truncated_file_is_an_error_not_a_signal() {
        if !PROTECTED {
            pleio_testkit::skip!("no SIGBUS protection on this target");
        }
        for (name, copy) in routines() {
            for rb in [5usize, 20, 40, 100] {
                faults_are_errors(name, copy, rb);
            }
        }
    }

    fn faults_are_errors(name: &str, copy_rows: CopyFn, rb: usize) {
        let m = Mapped::new(8);
        let page = crate::sys::page_size() as usize;
        m.file.set_len((3 * page) as u64).unwrap();
        // Rows 10 and 20 end on page 0; `far` lies on page 7, past the
        // new end.
        let far = (7 * page / rb) as u64 + 1;
        let rows = [10u64, 20, far, 5];
        let mut dst = vec![0u8; rows.len() * rb];
        // SAFETY: the rows lie inside the mapping (page 7 is unbacked now).
        let e = unsafe { copy_rows(&mut dst, m.ptr, &rows, rb) }.unwrap_err();
        assert_eq!(e.index, 2, "{name} {rb}");
        let off = e.addr - m.ptr as usize;
        let far_at = far as usize * rb;
        assert!((far_at..far_at + rb).contains(&off), "{name} {rb}: {off}");
        // The rows before it were copied.
        assert_eq!(dst[0], (10 * rb % 251) as u8, "{name} {rb}");
        // And again, from many threads at once.
        let base = m.ptr as usize;
        std::thread::scope(|s| {
            for t in 0..4u64 {
                s.spawn(move || {
                    let rows = [t, far + t];
                    let mut dst = vec![0u8; 2 * rb];
                    for _ in 0..100 {
                        // SAFETY: as above.
                        let e = unsafe { copy_rows(&mut dst, base as *const u8, &rows, rb) }
                            .unwrap_err();
                        assert_eq!(e.index, 1, "{name} {rb}");
                    }
                });
            }
        });
        // Grown back, the same mapping reads again.
        m.file.set_len((8 * page) as u64).unwrap();
        // SAFETY: as above.
        unsafe { copy_rows(&mut dst, m.ptr, &rows, rb) }.unwrap();
    }
}
