//! PLACEHOLDER: seeded random valid blocks.
