//! `aetrace-record`: the dynamic side. It runs programs rewritten by
//! `aetrace-rewrite` and keeps what they write: the launcher and its
//! witness drainer ([`launch`]), the shared libraries `--libs` selects and
//! how they are found ([`libs`]), the rewrite cache and traced runs
//! ([`commands`]; `#!` scripts followed as the kernel does, [`script`]; the
//! programs traced processes exec, rewritten and traced too, `follow`), and the counted runs that fill edge and path profiles
//! and event counts ([`counted`], [`paths`]).
//!
//! Invariants: the program sees its own exit status, signals and output;
//! a trace or profile is written under a temporary name and renamed, so no
//! partial file looks complete.

pub mod commands;
pub mod counted;
mod encode;
pub mod error;
mod execname;
mod follow;
pub mod launch;
pub mod libs;
pub mod paths;
pub mod script;

pub use aetrace_runtime::region::reserve_region_fd;
pub use error::{Error, Result};
pub use launch::quiet_workers;
