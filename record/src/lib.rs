//! `aetrace-record`: the static side.
pub mod report;
