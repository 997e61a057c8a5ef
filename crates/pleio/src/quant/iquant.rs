//! PLACEHOLDER: being written.

pub(super) fn decode_iq1_s(_src: &[u8], dst: &mut [f32]) {
    dst.fill(f32::NAN);
}

pub(super) fn decode_iq1_m(_src: &[u8], dst: &mut [f32]) {
    dst.fill(f32::NAN);
}

pub(super) fn decode_iq2_xxs(_src: &[u8], dst: &mut [f32]) {
    dst.fill(f32::NAN);
}

pub(super) fn decode_iq2_xs(_src: &[u8], dst: &mut [f32]) {
    dst.fill(f32::NAN);
}

pub(super) fn decode_iq2_s(_src: &[u8], dst: &mut [f32]) {
    dst.fill(f32::NAN);
}

pub(super) fn decode_iq3_xxs(_src: &[u8], dst: &mut [f32]) {
    dst.fill(f32::NAN);
}

pub(super) fn decode_iq3_s(_src: &[u8], dst: &mut [f32]) {
    dst.fill(f32::NAN);
}
