//! Copies out of file mappings that survive `SIGBUS`.
//!
//! Reading a mapped file page the file no longer holds (it was truncated,
//! shrunk, or rewritten in place with `O_TRUNC`), or a page the device
//! cannot read (an I/O error), raises `SIGBUS`, whose default action kills
//! the process. pleio copies row bytes out of its mappings with one small
//! assembly routine, [`copy_rows`], and installs (on first use) a `SIGBUS`
//! handler that turns a fault of that routine into an error: it sets the
//! routine's return registers (rows copied so far, faulting address) and
//! resumes at the routine's exit. Nothing unwinds through foreign frames and
//! no state is shared, so it is exact for any number of threads.
//!
//! # What counts as pleio's fault
//!
//! All three must hold, read from the signal alone:
//! - the kernel raised it (`si_code > 0`, e.g. `BUS_ADRERR` or
//!   `BUS_OBJERR`): a `SIGBUS` sent with `kill`, `tgkill` or `sigqueue`
//!   (`si_code <= 0`) never is, even while a thread copies;
//! - the interrupted instruction is one of the routine's row loads (not the
//!   load of the row index, not code elsewhere);
//! - the faulting address lies inside the row being copied, computed from
//!   the routine's registers (a store into a caller's mapped destination,
//!   or a fault in the row-index array, is not).
//!
//! Anything else goes to the disposition that was in place before pleio's
//! handler, as the kernel would have delivered it: a handler is called (with
//! its `sa_mask` blocked, `SA_NODEFER` and `SA_RESETHAND` honoured);
//! `SIG_IGN` ignores a sent signal; `SIG_DFL` (and `SIG_IGN` for a real
//! fault, which the kernel never lets a process ignore) restores the default
//! and lets the signal kill the process, re-raised if it was sent, re-raised
//! by the faulting instruction otherwise.
//!
//! # A host that changes the handler
//!
//! Every gather that reads through a mapping opens a [`Scope`], which checks
//! once (one `sigaction` query) that pleio's handler is still the one
//! installed:
//! - displaced by `SIG_DFL` or `SIG_IGN` (a host restored the default:
//!   CPython's `faulthandler.disable()` does when faulthandler was enabled
//!   first), the handler is installed again, now chaining to that default;
//! - displaced by another handler (one installed after pleio's, e.g.
//!   `faulthandler.enable()` after import, or a C host's own), it is left
//!   alone: that handler may chain back to pleio's, and installing over it
//!   could make the two call each other forever. The gather then reads the
//!   rows with `pread` instead of the mapping (see [`Scope::use_mapping`]),
//!   which fails with an error the same way and raises no signal.
//!
//! The scope also unblocks `SIGBUS` in the gathering thread for the copy if
//! the thread blocked it (a fault with `SIGBUS` blocked kills the process
//! whatever the handler), and blocks it again when the scope ends; with a
//! `SIGBUS` already pending the copy reads with `pread` instead, so the
//! pending signal stays where the host put it. [`state`] is the answer now.
//!
//! The routine copies with 32-byte AVX moves (16-byte SSE2 moves on a CPU
//! without AVX), so a 90-byte row costs three loads and stores; the caller
//! decodes from the copy, never from the mapping, so a fault leaves its
//! output untouched.
//!
//! Available on Linux x86_64 ([`PROTECTED`]). Elsewhere [`copy_rows`] is a
//! plain copy and a shrinking file still raises `SIGBUS`.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

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

/// Whether a read through pleio's mappings survives `SIGBUS` now (see
/// [`crate::Table::sigbus_guard`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SigbusGuard {
    /// pleio's handler is installed (again, if a host had restored the
    /// default): mapped strategies copy from the mapping, and a file that
    /// shrank or failed under it is an error.
    Active,
    /// A handler installed after pleio's displaced it: mapped strategies
    /// read their rows with `pread` instead of the mapping (slower, as
    /// safe), until pleio's handler is back.
    Displaced,
    /// No guard (a target other than Linux x86_64, or the OS refused the
    /// handler and nothing can be read instead): a mapped read of a file
    /// that shrank raises `SIGBUS`.
    Unprotected,
}

impl SigbusGuard {
    /// True unless [`SigbusGuard::Unprotected`]: a shrunk or failing file
    /// is an error for every strategy.
    pub fn is_protected(self) -> bool {
        !matches!(self, SigbusGuard::Unprotected)
    }
}

/// What one scope found and did, for the gather's stats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct GuardEvents {
    /// pleio's handler was found displaced.
    pub displaced: bool,
    /// ... and was installed again (it had been displaced by the default).
    pub reinstalled: bool,
    /// Rows were read with `pread` instead of the mapping.
    pub fell_back: bool,
}

/// What `imp::ensure` found.
enum Found {
    /// pleio's handler, installed before.
    Ours,
    /// Installed now, for the first time.
    Installed,
    /// Displaced by `SIG_DFL` or `SIG_IGN`, installed again.
    Reinstalled,
    /// Displaced by another handler, left alone.
    Foreign,
    /// The OS refused to tell or to install.
    Failed,
    /// No guard on this target.
    #[cfg_attr(all(target_os = "linux", target_arch = "x86_64"), allow(dead_code))]
    Unsupported,
}

/// Whether pleio's guard is in place now; installs it if it never was, or
/// installs it again over a restored default. Costs one `sigaction` query.
pub(crate) fn state() -> SigbusGuard {
    match imp::ensure() {
        Found::Ours | Found::Installed | Found::Reinstalled => SigbusGuard::Active,
        Found::Foreign | Found::Failed => SigbusGuard::Displaced,
        Found::Unsupported => SigbusGuard::Unprotected,
    }
}

/// How long a thread's finding that pleio's handler is in place and
/// `SIGBUS` unblocked is trusted by [`Scope::use_mapping_trusting_recent`].
const RECHECK: std::time::Duration = std::time::Duration::from_millis(10);

thread_local! {
    /// When a [`Scope`] of this thread last found the guard in place with
    /// `SIGBUS` unblocked.
    static LAST_CLEAN: Cell<Option<std::time::Instant>> = const { Cell::new(None) };
}

/// True if a [`Scope`] of this thread found pleio's handler in place and
/// `SIGBUS` unblocked within the last [`RECHECK`].
fn checked_recently() -> bool {
    LAST_CLEAN.with(|t| t.get().is_some_and(|at| at.elapsed() < RECHECK))
}

/// One gather's reads through mappings, from the calling thread: checks the
/// guard on first use (not before: a gather that never touches a mapping
/// costs nothing) and undoes what it changed when dropped. Not `Send`: the
/// signal mask it changes is the thread's.
#[derive(Default)]
pub(crate) struct Scope {
    armed: std::cell::OnceCell<imp::Armed>,
    fell_back: Cell<bool>,
}

impl Scope {
    /// A scope that has checked nothing yet.
    pub(crate) fn new() -> Scope {
        Scope::default()
    }

    /// True if rows may be copied out of the mapping with [`copy_rows`]:
    /// the guard is in place for this thread (or the target has none, and
    /// the mapping is read as it always was). False: read them from the
    /// file instead, and call [`Scope::note_fallback`].
    pub(crate) fn use_mapping(&self) -> bool {
        self.check(false)
    }

    /// [`Scope::use_mapping`] for a hot path whose mapping rarely faults
    /// (the machine-wide cache's segment): trusts a clean finding of this
    /// thread's within the last 10 ms instead of checking again (two system
    /// calls saved), at the price of a host that displaces the handler or
    /// blocks `SIGBUS` being noticed up to 10 ms late.
    pub(crate) fn use_mapping_trusting_recent(&self) -> bool {
        self.check(true)
    }

    fn check(&self, trust: bool) -> bool {
        let armed = self.armed.get_or_init(|| {
            if trust && checked_recently() {
                return imp::Armed::trusted();
            }
            let armed = imp::Armed::arm();
            if armed.use_mapping() && !armed.unblocked() {
                LAST_CLEAN.with(|t| t.set(Some(std::time::Instant::now())));
            }
            armed
        });
        armed.use_mapping()
    }

    /// Records that rows were read from the file instead of the mapping.
    pub(crate) fn note_fallback(&self) {
        self.fell_back.set(true);
    }

    /// What this scope found and did.
    pub(crate) fn events(&self) -> GuardEvents {
        let mut e = self.armed.get().map(imp::Armed::events).unwrap_or_default();
        e.fell_back = self.fell_back.get();
        e
    }
}

/// Most shared-memory mappings one process registers at once.
const SHARED_REGIONS: usize = 64;

/// One registered shared-memory mapping (`start` 0: free; `usize::MAX`:
/// being registered).
struct Region {
    start: AtomicUsize,
    len: AtomicUsize,
    lost: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE_REGION: Region = Region {
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    lost: AtomicBool::new(false),
};

/// The machine-wide cache's segments mapped by this process, read by the
/// `SIGBUS` handler (atomics only: async-signal-safe).
static REGIONS: [Region; SHARED_REGIONS] = [FREE_REGION; SHARED_REGIONS];

/// A shared-memory mapping whose file any process that may write it can
/// shrink (the machine-wide cache's segment). With pleio's handler in
/// place, a `SIGBUS` on it replaces the whole mapping with private
/// zero-filled memory of the same size and marks it [`SharedRegion::lost`]:
/// the faulting access and every later one read zeros (which no segment
/// validates: no magic, no ready slot, a changed seqlock version), so the
/// gather in flight serves its rows from the device and the next one
/// attaches a new segment. Registered by [`crate::sys::shm::SharedWords`].
pub(crate) struct SharedRegion {
    slot: usize,
}

impl SharedRegion {
    /// Registers the mapping `addr..addr + len` (page-rounded), installing
    /// pleio's handler if it never was. `None` when [`SHARED_REGIONS`] are
    /// registered already.
    pub(crate) fn register(addr: usize, len: usize) -> Option<SharedRegion> {
        let _ = imp::ensure();
        let page = super::page_size() as usize;
        let len = len.checked_next_multiple_of(page)?;
        for (slot, r) in REGIONS.iter().enumerate() {
            if r.start
                .compare_exchange(0, usize::MAX, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                r.len.store(len, Ordering::Relaxed);
                r.lost.store(false, Ordering::Relaxed);
                r.start.store(addr, Ordering::Release);
                return Some(SharedRegion { slot });
            }
        }
        None
    }

    /// True once a `SIGBUS` replaced the mapping with zeros (its file was
    /// shrunk by another process).
    pub(crate) fn lost(&self) -> bool {
        REGIONS[self.slot].lost.load(Ordering::Acquire)
    }
}

impl Drop for SharedRegion {
    fn drop(&mut self) {
        let r = &REGIONS[self.slot];
        r.start.store(usize::MAX, Ordering::Release);
        r.len.store(0, Ordering::Relaxed);
        r.lost.store(false, Ordering::Relaxed);
        r.start.store(0, Ordering::Release);
    }
}

/// The registered region holding `addr`, as (start, length, lost flag).
#[cfg_attr(
    not(all(target_os = "linux", target_arch = "x86_64")),
    allow(dead_code)
)]
fn region_of(addr: usize) -> Option<(usize, usize, &'static AtomicBool)> {
    REGIONS.iter().find_map(|r| {
        let start = r.start.load(Ordering::Acquire);
        let len = r.len.load(Ordering::Relaxed);
        (start != 0 && start != usize::MAX && addr.wrapping_sub(start) < len)
            .then_some((start, len, &r.lost))
    })
}

/// Copies `row_bytes` bytes from `base + rows[i] * row_bytes` to
/// `dst[i * row_bytes..]` for every `i`, in order. A read that raises
/// `SIGBUS` stops the copy: `Err` names the row and the address. `dst`
/// then holds the rows before it and unspecified bytes in its slot.
///
/// Protected only while a [`Scope`] of this thread said
/// [`Scope::use_mapping`] on a [`PROTECTED`] target.
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
    unsafe { imp::copy_scaled(dst, base, rows, row_bytes, row_bytes) }
}

/// Copies `len` bytes from each address of `addrs` to `dst[i * len..]`, in
/// order: [`copy_rows`] for parts that lie in different places (several
/// tensors, several files' mappings), one guarded call for all of them.
/// `Err` names the index of the address whose read raised `SIGBUS`.
///
/// # Safety
///
/// `dst` holds at least `addrs.len() * len` bytes (no overflow), and each
/// `addrs[i]..addrs[i] + len` lies inside one live read-only mapping of a
/// file, as for [`copy_rows`].
pub(crate) unsafe fn copy_from(dst: &mut [u8], addrs: &[u64], len: usize) -> Result<(), CopyFault> {
    debug_assert!(addrs.len().checked_mul(len).is_some_and(|n| n <= dst.len()));
    // SAFETY: forwarded from the caller; a null base and a scale of 1 make
    // each entry its own source address.
    unsafe { imp::copy_scaled(dst, std::ptr::null(), addrs, len, 1) }
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
mod imp {
    use std::ffi::c_void;
    use std::marker::PhantomData;
    use std::sync::atomic::{AtomicU8, Ordering};
    use std::sync::{Mutex, OnceLock};

    use super::{CopyFault, Found, GuardEvents};

    pub(super) const PROTECTED: bool = true;

    // pleio_guarded_copy_rows(dst: rdi, base: rsi, rows: rdx, n: rcx,
    //                         len: r8, scale: r9)
    //     -> (rax: rows left, 0 when all were copied; rdx: 0)
    //
    // Row `rows[i]` is `len` bytes at `base + rows[i] * scale`: `scale ==
    // len` for rows of one tensor, 1 for byte offsets (absolute addresses
    // with a null base). `rdx` points at the next row, `rcx` counts the
    // rows left. The row is copied from `r10` to `rdi`, `r11` bytes left;
    // throughout the copy of a row, `r10 - (r8 - r11)` is the row's first
    // source byte (the tail load from `rax` moves neither). Between
    // pleio_guarded_copy_loads and the landing, only loads of row bytes
    // (from `r10`/`rax`) read the mapping; the handler then sets rdx to the
    // faulting address and rip to pleio_guarded_copy_fault, which returns
    // (rax: rcx, the rows left counting the one that faulted; rdx: the
    // address). Caller-saved registers only (rax, rcx, rdx, rsi, rdi,
    // r8-r11, xmm0); no stack.
    std::arch::global_asm!(
        ".pushsection .text.pleio_guarded_copy,\"ax\",@progbits",
        ".p2align 4",
        ".globl pleio_guarded_copy_rows",
        ".hidden pleio_guarded_copy_rows",
        ".type pleio_guarded_copy_rows,@function",
        "pleio_guarded_copy_rows:",
        "20:",
        "    test rcx, rcx",
        "    jz 29f",
        "    mov r10, qword ptr [rdx]",
        "    imul r10, r9",
        "    add r10, rsi",
        "    mov r11, r8",
        // From here to the landing, only row bytes are loaded.
        ".globl pleio_guarded_copy_loads",
        ".hidden pleio_guarded_copy_loads",
        "pleio_guarded_copy_loads:",
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
        "    add rdx, 8",
        "    dec rcx",
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
        "    xor eax, eax",
        "    xor edx, edx",
        "    ret",
        ".size pleio_guarded_copy_rows, . - pleio_guarded_copy_rows",
        ".globl pleio_guarded_copy_fault",
        ".hidden pleio_guarded_copy_fault",
        ".type pleio_guarded_copy_fault,@function",
        "pleio_guarded_copy_fault:",
        "    mov rax, rcx",
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
        "30:",
        "    test rcx, rcx",
        "    jz 39f",
        "    mov r10, qword ptr [rdx]",
        "    imul r10, r9",
        "    add r10, rsi",
        "    mov r11, r8",
        ".globl pleio_guarded_copy_loads_avx",
        ".hidden pleio_guarded_copy_loads_avx",
        "pleio_guarded_copy_loads_avx:",
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
        "    add rdx, 8",
        "    dec rcx",
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
        "    xor eax, eax",
        "    xor edx, edx",
        "    ret",
        ".size pleio_guarded_copy_rows_avx, . - pleio_guarded_copy_rows_avx",
        ".globl pleio_guarded_copy_fault_avx",
        ".hidden pleio_guarded_copy_fault_avx",
        ".type pleio_guarded_copy_fault_avx,@function",
        "pleio_guarded_copy_fault_avx:",
        "    vzeroupper",
        "    mov rax, rcx",
        "    ret",
        ".size pleio_guarded_copy_fault_avx, . - pleio_guarded_copy_fault_avx",
        ".popsection",
    );

    /// The routine's two return registers (SysV: a 16-byte struct of two
    /// integers comes back in rax and rdx).
    #[repr(C)]
    struct Copied {
        left: usize,
        fault_addr: usize,
    }

    extern "sysv64" {
        fn pleio_guarded_copy_rows(
            dst: *mut u8,
            base: *const u8,
            rows: *const u64,
            n: usize,
            len: usize,
            scale: usize,
        ) -> Copied;
        fn pleio_guarded_copy_loads();
        fn pleio_guarded_copy_fault();
        fn pleio_guarded_copy_rows_avx(
            dst: *mut u8,
            base: *const u8,
            rows: *const u64,
            n: usize,
            len: usize,
            scale: usize,
        ) -> Copied;
        fn pleio_guarded_copy_loads_avx();
        fn pleio_guarded_copy_fault_avx();
    }

    /// The disposition found when pleio first installed its handler: where
    /// a `SIGBUS` that is not ours goes, unless [`OVERRIDE`] says otherwise.
    static ORIGINAL: OnceLock<libc::sigaction> = OnceLock::new();

    /// Set when pleio installed its handler again over a restored default:
    /// [`DEFAULT`] or [`IGNORE`] then replaces [`ORIGINAL`]; [`ORIGINAL`]
    /// otherwise.
    static OVERRIDE: AtomicU8 = AtomicU8::new(ORIGINAL_PREV);
    const ORIGINAL_PREV: u8 = 0;
    const DEFAULT: u8 = 1;
    const IGNORE: u8 = 2;

    /// Serializes installing (never taken in the handler).
    static INSTALL: Mutex<()> = Mutex::new(());

    /// The current `SIGBUS` disposition.
    fn current() -> Option<libc::sigaction> {
        // SAFETY: sigaction with a null new action only reads the current
        // one into `now`, plain data we own.
        unsafe {
            let mut now: libc::sigaction = std::mem::zeroed();
            (libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut now) == 0).then_some(now)
        }
    }

    fn is_ours(a: &libc::sigaction) -> bool {
        a.sa_sigaction == on_sigbus as *const () as usize && a.sa_flags & libc::SA_SIGINFO != 0
    }

    /// Makes sure pleio's handler is installed, where that is safe (see the
    /// module documentation). One `sigaction` query when it is.
    pub(super) fn ensure() -> Found {
        match current() {
            Some(now) if is_ours(&now) => return Found::Ours,
            Some(_) => {}
            None => return Found::Failed,
        }
        let _one = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
        // Again under the lock: another thread may have installed it.
        let Some(now) = current() else {
            return Found::Failed;
        };
        if is_ours(&now) {
            return Found::Ours;
        }
        let first = ORIGINAL.get().is_none();
        if first {
            let _ = ORIGINAL.set(now);
        } else if now.sa_sigaction == libc::SIG_DFL {
            OVERRIDE.store(DEFAULT, Ordering::SeqCst);
        } else if now.sa_sigaction == libc::SIG_IGN {
            OVERRIDE.store(IGNORE, Ordering::SeqCst);
        } else {
            return Found::Foreign;
        }
        // SAFETY: installs `on_sigbus`, an async-signal-safe handler (it
        // reads the interrupted context and atomics, writes the context,
        // or calls the previous handler, sigaction, pthread_sigmask or
        // raise, all async-signal-safe). SA_ONSTACK keeps Rust's alternate
        // signal stack usable for the chained handler.
        let (ok, replaced) = unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_sigbus as *const () as usize;
            act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut act.sa_mask);
            let mut replaced: libc::sigaction = std::mem::zeroed();
            let ok = libc::sigaction(libc::SIGBUS, &act, &mut replaced) == 0;
            (ok, replaced)
        };
        if !ok {
            return Found::Failed;
        }
        if replaced.sa_sigaction != now.sa_sigaction {
            // A handler installed between the query and ours (by a thread
            // that does not take our lock): put it back, it was last.
            // SAFETY: reinstates exactly what sigaction just returned.
            unsafe { libc::sigaction(libc::SIGBUS, &replaced, std::ptr::null_mut()) };
            return Found::Foreign;
        }
        if first {
            Found::Installed
        } else {
            Found::Reinstalled
        }
    }

    /// One gather's check of the guard (see [`super::Scope`]).
    pub(super) struct Armed {
        /// Copy out of the mapping (else read the file).
        use_mapping: bool,
        /// SIGBUS was blocked in this thread and unblocked here.
        reblock: bool,
        events: GuardEvents,
        /// The signal mask is the thread's: stay on it.
        _thread: PhantomData<*const ()>,
    }

    impl Armed {
        pub(super) fn arm() -> Armed {
            let found = ensure();
            let mut armed = Armed {
                use_mapping: false,
                reblock: false,
                events: GuardEvents {
                    displaced: matches!(found, Found::Reinstalled | Found::Foreign),
                    reinstalled: matches!(found, Found::Reinstalled),
                    fell_back: false,
                },
                _thread: PhantomData,
            };
            if matches!(found, Found::Ours | Found::Installed | Found::Reinstalled) {
                match unblock() {
                    Some(reblock) => {
                        armed.use_mapping = true;
                        armed.reblock = reblock;
                    }
                    None => armed.use_mapping = false,
                }
            }
            armed
        }

        /// A thread's recent clean finding, trusted without a check: the
        /// mapping is read, nothing to undo, nothing to report.
        pub(super) fn trusted() -> Armed {
            Armed {
                use_mapping: true,
                reblock: false,
                events: GuardEvents::default(),
                _thread: PhantomData,
            }
        }

        pub(super) fn use_mapping(&self) -> bool {
            self.use_mapping
        }

        /// True if `SIGBUS` was blocked in this thread and unblocked here.
        pub(super) fn unblocked(&self) -> bool {
            self.reblock
        }

        pub(super) fn events(&self) -> GuardEvents {
            self.events
        }
    }

    impl Drop for Armed {
        fn drop(&mut self) {
            if self.reblock {
                // SAFETY: blocks SIGBUS again in this thread (the scope is
                // not Send), as it was before `unblock`.
                unsafe {
                    let set = sigbus_set();
                    libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
                }
            }
        }
    }

    fn sigbus_set() -> libc::sigset_t {
        // SAFETY: initializes a signal set we own.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGBUS);
            set
        }
    }

    /// Leaves `SIGBUS` unblocked in this thread: `Some(true)` if it had to
    /// unblock it, `Some(false)` if it was not blocked, `None` if it is
    /// blocked with a `SIGBUS` pending (unblocking would deliver the host's
    /// signal now): then nothing changed. One mask query when not blocked.
    fn unblock() -> Option<bool> {
        // SAFETY: mask and pending-set queries into sets we own; the
        // unblock changes only this thread's mask, put back by `Armed`.
        unsafe {
            let mut mask: libc::sigset_t = std::mem::zeroed();
            if libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut mask) != 0 {
                return None;
            }
            if libc::sigismember(&mask, libc::SIGBUS) != 1 {
                return Some(false);
            }
            let mut pending: libc::sigset_t = std::mem::zeroed();
            if libc::sigpending(&mut pending) != 0 || libc::sigismember(&pending, libc::SIGBUS) != 0
            {
                return None;
            }
            let set = sigbus_set();
            (libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) == 0)
                .then_some(true)
        }
    }

    unsafe extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
        let routines = [
            (
                pleio_guarded_copy_loads as *const () as usize,
                pleio_guarded_copy_fault as *const () as usize,
            ),
            (
                pleio_guarded_copy_loads_avx as *const () as usize,
                pleio_guarded_copy_fault_avx as *const () as usize,
            ),
        ];
        // SAFETY: the kernel passes a valid siginfo and ucontext_t to an
        // SA_SIGINFO handler; the context is ours to read and modify until
        // we return.
        let (code, addr, gregs) = unsafe {
            (
                (*info).si_code,
                (*info).si_addr() as usize,
                &mut (*ctx.cast::<libc::ucontext_t>()).uc_mcontext.gregs,
            )
        };
        let reg = |r: libc::c_int| gregs[r as usize] as usize;
        let rip = reg(libc::REG_RIP);
        let landing = routines
            .iter()
            .find(|(loads, landing)| (*loads..*landing).contains(&rip))
            .map(|&(_, landing)| landing);
        if let Some(landing) = landing {
            // The row being copied: `r8` bytes from `r10 - (r8 - r11)`.
            let row_bytes = reg(libc::REG_R8);
            let done = row_bytes.wrapping_sub(reg(libc::REG_R11));
            let row_start = reg(libc::REG_R10).wrapping_sub(done);
            let in_row = addr.wrapping_sub(row_start) < row_bytes;
            if code > 0 && in_row {
                // A load of a row faulted: resume at the landing, which
                // returns the rows left (rcx, intact) and rdx.
                gregs[libc::REG_RDX as usize] = addr as i64;
                gregs[libc::REG_RIP as usize] = landing as i64;
                return;
            }
        }
        if code > 0 {
            if let Some((start, len, lost)) = super::region_of(addr) {
                // SAFETY: errno is this thread's; saved and restored so the
                // interrupted code never sees ours.
                let errno = unsafe { *libc::__errno_location() };
                // SAFETY: replaces exactly a registered shared segment
                // mapping (live: its owner is reading it, the fault came
                // from it) with private anonymous memory of the same size
                // and protection; only atomics access it, so zeros are
                // just values the segment's readers reject. mmap is a
                // plain system call (no lock, no allocation).
                let p = unsafe {
                    libc::mmap(
                        start as *mut c_void,
                        len,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_PRIVATE
                            | libc::MAP_ANONYMOUS
                            | libc::MAP_FIXED
                            | libc::MAP_NORESERVE,
                        -1,
                        0,
                    )
                };
                // SAFETY: as above.
                unsafe { *libc::__errno_location() = errno };
                if p == start as *mut c_void {
                    lost.store(true, Ordering::Release);
                    return;
                }
            }
        }
        // SAFETY: forwarding the kernel's own arguments.
        unsafe { chain(sig, info, ctx) }
    }

    /// The disposition a `SIGBUS` that is not ours goes to.
    fn previous() -> libc::sigaction {
        let plain = |handler| {
            // SAFETY: a zeroed sigaction is a valid plain disposition.
            let mut a: libc::sigaction = unsafe { std::mem::zeroed() };
            a.sa_sigaction = handler;
            a
        };
        match OVERRIDE.load(Ordering::SeqCst) {
            DEFAULT => plain(libc::SIG_DFL),
            IGNORE => plain(libc::SIG_IGN),
            _ => ORIGINAL
                .get()
                .copied()
                .unwrap_or_else(|| plain(libc::SIG_DFL)),
        }
    }

    /// Sets the default disposition (async-signal-safe).
    fn set_default(sig: libc::c_int) {
        // SAFETY: sigaction with a plain default disposition we own.
        unsafe {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            libc::sigemptyset(&mut dfl.sa_mask);
            libc::sigaction(sig, &dfl, std::ptr::null_mut());
        }
    }

    /// Hands a `SIGBUS` that is not ours to the previous disposition, as the
    /// kernel would have delivered it.
    unsafe fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
        let prev = previous();
        // SAFETY: `info` is the kernel's valid siginfo.
        let sent = unsafe { (*info).si_code } <= 0;
        let handler = prev.sa_sigaction;
        if handler == libc::SIG_IGN && sent {
            return; // kill(2) of an ignored signal: ignore it.
        }
        if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
            // Default action (a fault cannot be ignored): restore it; a
            // fault then recurs on return and kills the process as it
            // would have without pleio, and a sent signal is raised again
            // (delivered when this handler returns: SIGBUS is blocked here).
            set_default(sig);
            if sent {
                // SAFETY: raise is async-signal-safe.
                unsafe { libc::raise(sig) };
            }
            return;
        }
        if prev.sa_flags & libc::SA_RESETHAND != 0 {
            // A one-shot handler: the kernel would have reset the
            // disposition before calling it. Ours is gone now too; the
            // next gather finds the default and installs it again.
            set_default(sig);
            OVERRIDE.store(DEFAULT, Ordering::SeqCst);
        }
        // The mask the kernel would have set for it: its sa_mask, and the
        // signal itself unless SA_NODEFER.
        // SAFETY: signal-set operations on sets we own, and
        // pthread_sigmask, async-signal-safe; restored below.
        let saved = unsafe {
            let mut saved: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, &prev.sa_mask, &mut saved);
            if prev.sa_flags & libc::SA_NODEFER != 0 {
                let set = sigbus_set();
                libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            }
            saved
        };
        // SAFETY: `handler` is the function pointer the previous sigaction
        // installed, with the signature its flags declare; the arguments
        // are the kernel's.
        unsafe {
            if prev.sa_flags & libc::SA_SIGINFO != 0 {
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut c_void) =
                    std::mem::transmute(handler);
                f(sig, info, ctx);
            } else {
                let f: extern "C" fn(libc::c_int) = std::mem::transmute(handler);
                f(sig);
            }
            libc::pthread_sigmask(libc::SIG_SETMASK, &saved, std::ptr::null_mut());
        }
    }

    pub(super) unsafe fn copy_scaled(
        dst: &mut [u8],
        base: *const u8,
        rows: &[u64],
        len: usize,
        scale: usize,
    ) -> Result<(), CopyFault> {
        let avx = std::arch::is_x86_feature_detected!("avx");
        // SAFETY: forwarded from the caller.
        unsafe { copy_scaled_with(avx, dst, base, rows, len, scale) }
    }

    /// [`copy_scaled`] with the AVX routine (`avx`, which the CPU must
    /// have) or the SSE2 one.
    pub(super) unsafe fn copy_scaled_with(
        avx: bool,
        dst: &mut [u8],
        base: *const u8,
        rows: &[u64],
        len: usize,
        scale: usize,
    ) -> Result<(), CopyFault> {
        if rows.is_empty() || len == 0 {
            return Ok(());
        }
        // SAFETY: the caller guarantees `dst` has room for every row and
        // every source range is inside a live mapping (and the CPU has AVX
        // if `avx`); the routine reads only those ranges and `rows`, writes
        // only `dst`, and a SIGBUS of its row loads is turned into a return
        // by `on_sigbus` (when installed: see `Scope`).
        let done = unsafe {
            let copy = if avx {
                pleio_guarded_copy_rows_avx
            } else {
                pleio_guarded_copy_rows
            };
            copy(
                dst.as_mut_ptr(),
                base,
                rows.as_ptr(),
                rows.len(),
                len,
                scale,
            )
        };
        match done.left {
            0 => Ok(()),
            left => Err(CopyFault {
                index: rows.len().saturating_sub(left),
                addr: done.fault_addr,
            }),
        }
    }
}

#[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
mod imp {
    use std::marker::PhantomData;

    use super::{CopyFault, Found, GuardEvents};

    pub(super) const PROTECTED: bool = false;

    pub(super) fn ensure() -> Found {
        Found::Unsupported
    }

    /// Nothing to check: the mapping is read as it is.
    pub(super) struct Armed(PhantomData<*const ()>);

    impl Armed {
        pub(super) fn arm() -> Armed {
            Armed(PhantomData)
        }

        pub(super) fn trusted() -> Armed {
            Armed(PhantomData)
        }

        pub(super) fn use_mapping(&self) -> bool {
            true
        }

        pub(super) fn unblocked(&self) -> bool {
            false
        }

        pub(super) fn events(&self) -> GuardEvents {
            GuardEvents::default()
        }
    }

    pub(super) unsafe fn copy_scaled(
        dst: &mut [u8],
        base: *const u8,
        rows: &[u64],
        len: usize,
        scale: usize,
    ) -> Result<(), CopyFault> {
        // SAFETY: forwarded from the caller.
        unsafe { super::plain_copy(dst, base, rows, len, scale) };
        Ok(())
    }
}

/// The unprotected copy: what [`copy_rows`] does where no handler exists.
///
/// # Safety
///
/// As for [`copy_rows`]; a fault here raises `SIGBUS`.
#[allow(dead_code)]
unsafe fn plain_copy(dst: &mut [u8], base: *const u8, rows: &[u64], len: usize, scale: usize) {
    for (&row, slot) in rows.iter().zip(dst.chunks_exact_mut(len)) {
        // SAFETY: the caller guarantees the source range is mapped and
        // readable and `slot` is `len` long.
        let src = unsafe {
            std::slice::from_raw_parts(base.wrapping_add(row as usize * scale), len)
        };
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
        let mut v: Vec<(&'static str, CopyFn)> =
            vec![("default", copy_rows), ("addresses", by_address)];
        #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
        {
            // SAFETY (of the closures): forwarded; AVX only where detected.
            v.push(("sse2", |d, b, r, n| unsafe {
                imp::copy_scaled_with(false, d, b, r, n, n)
            }));
            if std::arch::is_x86_feature_detected!("avx") {
                v.push(("avx", |d, b, r, n| unsafe {
                    imp::copy_scaled_with(true, d, b, r, n, n)
                }));
            }
        }
        v
    }

    /// [`copy_rows`] through [`copy_from`]: each row's address computed.
    unsafe fn by_address(
        dst: &mut [u8],
        base: *const u8,
        rows: &[u64],
        rb: usize,
    ) -> Result<(), CopyFault> {
        let addrs: Vec<u64> = rows
            .iter()
            .map(|&r| base as u64 + r * rb as u64)
            .collect();
        // SAFETY: forwarded from the caller.
        unsafe { copy_from(dst, &addrs, rb) }
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
        // Installs the handler (as a gather's first mapped read does).
        assert!(Scope::new().use_mapping());
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
