//! `aetrace-format`: everything aetrace writes to disk.
