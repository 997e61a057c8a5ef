//! PLACEHOLDER: being written.

pub(super) fn decode_q4_0(_src: &[u8], dst: &mut [f32]) {
    dst.fill(f32::NAN);
}

pub(super) fn decode_q4_1(_src: &[u8], dst: &mut [f32]) {
    dst.fill(f32::NAN);
}

pub(super) fn decode_q5_0(_src: &[u8], dst: &mut [f32]) {
    dst.fill(f32::NAN);
}

pub(super) fn decode_q5_1(_src: &[u8], dst: &mut [f32]) {
    dst.fill(f32::NAN);
}

pub(super) fn decode_q8_0(_src: &[u8], dst: &mut [f32]) {
    dst.fill(f32::NAN);
}

pub(super) fn decode_iq4_nl(_src: &[u8], dst: &mut [f32]) {
    dst.fill(f32::NAN);
}

pub(super) fn decode_iq4_xs(_src: &[u8], dst: &mut [f32]) {
    dst.fill(f32::NAN);
}
