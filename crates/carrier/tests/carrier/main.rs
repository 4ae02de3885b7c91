//! The carrier crate's integration tests, one binary (each binary links the
//! whole tree, so one per crate keeps the build short).

mod common;

mod folder;
mod folder_disk;
