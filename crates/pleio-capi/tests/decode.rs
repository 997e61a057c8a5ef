//! `pleio_decode`: a table's stored rows (a `PLEIO_DTYPE_RAW` gather)
//! decode to the bytes the decoding gathers write, for every output type
//! and for GGUF types with and without 16-bit kernels; bad arguments fail
//! with their status and write nothing.

use std::ffi::{c_void, CString};
use std::ptr::{null, null_mut};

use pleio::quant::GgmlType;
use pleio_capi::ffi::*;
use pleio_capi::status::Status;
use pleio_lab::synth::SynthSpec;

/// Rows `ids` of `t` as `dtype` (0 f32, 1 bf16, 2 f16, 3 raw).
fn gather(t: *mut pleio_table, ids: &[i64], dtype: u32, bytes_per_row: usize) -> Vec<u8> {
    let mut out = vec![0u8; ids.len() * bytes_per_row];
    // SAFETY: ids and out are live slices of the lengths passed.
    let rc = unsafe {
        pleio_gather(
            t,
            ids.as_ptr(),
            ids.len(),
            DtypeArg(dtype),
            out.as_mut_ptr().cast(),
            out.len(),
            null_mut(),
        )
    };
    assert_eq!(rc, 0);
    out
}

/// `pleio_decode` of `src` as `dtype` into `out`: the status and the
/// elements it reports.
fn decode(ty: u32, src: &[u8], dtype: u32, out: &mut [u8]) -> (i32, usize) {
    let mut elems = usize::MAX;
    // SAFETY: src and out are live slices of the lengths passed; elems is a
    // writable size_t.
    let rc = unsafe {
        pleio_decode(
            ty,
            src.as_ptr().cast::<c_void>(),
            src.len(),
            DtypeArg(dtype),
            out.as_mut_ptr().cast(),
            out.len(),
            &mut elems,
        )
    };
    (rc, elems)
}

#[test]
fn raw_rows_decode_as_the_decoding_gathers_write_them() {
    // IQ4_NL has 16-bit kernels, Q8_0 only the f32 decoder.
    for ty in [GgmlType::IQ4_NL, GgmlType::Q8_0] {
        let file = tempfile::NamedTempFile::new().unwrap();
        SynthSpec::qwen(ty, 3000, 7)
            .write(file.reopen().unwrap(), &mut |_| {})
            .unwrap();
        let path = CString::new(file.path().to_str().unwrap()).unwrap();
        let mut t = null_mut();
        // SAFETY: a NUL-terminated path and a writable out pointer.
        assert_eq!(unsafe { pleio_open(path.as_ptr(), null(), &mut t) }, 0);
        let mut info = std::mem::MaybeUninit::<pleio_info>::uninit();
        // SAFETY: an open handle and a writable pleio_info.
        assert_eq!(unsafe { pleio_table_info(t, info.as_mut_ptr()) }, 0);
        // SAFETY: pleio_table_info returned 0, so it wrote the struct.
        let info = unsafe { info.assume_init() };
        let (elems, row_bytes) = (info.row_elems as usize, info.row_bytes as usize);
        let ids = [0i64, 2999, 17, 17, 1500];
        let raw = gather(t, &ids, 3, row_bytes);
        for (dtype, size) in [(0u32, 4usize), (1, 2), (2, 2)] {
            let want = gather(t, &ids, dtype, elems * size);
            // one byte more than needed, and misaligned for f32: the byte path
            let mut got = vec![0xAAu8; want.len() + 2];
            let (rc, n) = decode(info.ggml_type, &raw, dtype, &mut got[1..]);
            assert_eq!((rc, n), (0, ids.len() * elems), "{ty} dtype {dtype}");
            assert_eq!(&got[1..=want.len()], &want[..], "{ty} dtype {dtype}");
            assert_eq!((got[0], got[want.len() + 1]), (0xAA, 0xAA));
            if dtype == 0 {
                let mut f = vec![0f32; ids.len() * elems];
                // SAFETY: f32s viewed as bytes, for the aligned path.
                let bytes = unsafe {
                    std::slice::from_raw_parts_mut(f.as_mut_ptr().cast::<u8>(), f.len() * 4)
                };
                assert_eq!(decode(info.ggml_type, &raw, 0, bytes).0, 0);
                let le: Vec<u8> = f.iter().flat_map(|x| x.to_le_bytes()).collect();
                assert_eq!(le, want);
            }
        }
        pleio_close(t);
    }
}

#[test]
fn bad_arguments_fail_with_their_status_and_write_nothing() {
    let ty = GgmlType::Q8_0;
    let src = vec![0u8; 2 * ty.block_bytes()];
    let mut out = vec![7u8; 64 * 4];
    let code = |s: Status| s as i32;
    // too small for 64 floats
    assert_eq!(
        decode(ty.id(), &src, 0, &mut out[..255]).0,
        code(Status::PLEIO_ERR_OUTPUT_SIZE)
    );
    // not whole blocks
    assert_eq!(
        decode(ty.id(), &src[..35], 0, &mut out).0,
        code(Status::PLEIO_ERR_OUTPUT_SIZE)
    );
    // no such type, and raw output
    assert_eq!(
        decode(4242, &src, 0, &mut out).0,
        code(Status::PLEIO_ERR_UNSUPPORTED)
    );
    assert_eq!(
        decode(ty.id(), &src, 3, &mut out).0,
        code(Status::PLEIO_ERR_UNSUPPORTED)
    );
    // a dtype outside the enum
    assert_eq!(
        decode(ty.id(), &src, 9, &mut out).0,
        code(Status::PLEIO_ERR_ARGUMENT)
    );
    assert!(out.iter().all(|&b| b == 7));
    // NULL src with bytes, overlapping buffers
    // SAFETY: NULL is refused before any read; out is a live slice.
    let rc = unsafe {
        pleio_decode(
            ty.id(),
            null(),
            34,
            DtypeArg(0),
            out.as_mut_ptr().cast(),
            out.len(),
            null_mut(),
        )
    };
    assert_eq!(rc, code(Status::PLEIO_ERR_ARGUMENT));
    let mut both = vec![0u8; 300];
    let p = both.as_mut_ptr();
    // SAFETY: both ranges lie inside `both`; the overlap is refused first.
    let rc = unsafe {
        pleio_decode(
            ty.id(),
            p.cast_const().cast(),
            34,
            DtypeArg(0),
            p.add(10).cast(),
            128,
            null_mut(),
        )
    };
    assert_eq!(rc, code(Status::PLEIO_ERR_ARGUMENT));
    // nothing to decode: NULL buffers are fine
    // SAFETY: zero lengths; nothing is read or written.
    let rc = unsafe { pleio_decode(ty.id(), null(), 0, DtypeArg(0), null_mut(), 0, null_mut()) };
    assert_eq!(rc, 0);
}
