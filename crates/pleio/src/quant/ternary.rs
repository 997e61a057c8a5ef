//! PLACEHOLDER: being written.

pub(super) fn decode_tq1_0(_src: &[u8], dst: &mut [f32]) {
    dst.fill(f32::NAN);
}

pub(super) fn decode_tq2_0(_src: &[u8], dst: &mut [f32]) {
    dst.fill(f32::NAN);
}
