//! The binary's own modules: its allocator, the `keys` subcommand's arguments and output,
//! and the manual (--help epilogue, man pages, completions).

pub mod allocator;
pub mod args;
pub mod keys;
pub mod manual;
