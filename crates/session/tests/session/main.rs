//! The session crate's integration tests, one binary (each binary links the
//! whole tree, so one per crate keeps the build short).

mod fuzz_corpus;
mod protocol_rules;
