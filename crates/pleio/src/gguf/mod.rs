//! PLACEHOLDER: GGUF reading and writing.
