//! The thread of gdb's last `Hc` packet, read off the connection.
//!
//! gdb names the thread a reverse command moves only with `Hc` before `bc`
//! or `bs` (under `set scheduler-locking on`: `Hc` of the selected thread;
//! otherwise `Hc0`, any thread), and only when it changed. gdbstub keeps
//! `Hc` to itself and calls the target's reverse continue without a
//! thread, so [`Watch`] wraps the connection and notes each `Hc` gdb
//! sends (docs/debug.md, "Threads"). Invariant: the noted thread is the
//! one gdb believes it set, `None` for "any" and "all".

use gdbstub::common::Tid;
use gdbstub::conn::{Connection, ConnectionExt};
use std::cell::Cell;
use std::rc::Rc;

/// The thread of the last `Hc`, shared between the connection and the
/// target.
pub type Noted = Rc<Cell<Option<Tid>>>;

/// Longest packet body kept: `Hcp` and two hex ids fit.
const KEEP: usize = 40;

/// A connection that notes `Hc` packets (see the module comment).
pub struct Watch<C> {
    inner: C,
    /// The body of the packet being read (its first [`KEEP`] bytes), while
    /// inside one.
    body: Option<Vec<u8>>,
    noted: Noted,
}

impl<C> Watch<C> {
    /// `inner`, noting into `noted`.
    pub fn new(inner: C, noted: Noted) -> Self {
        Watch {
            inner,
            body: None,
            noted,
        }
    }

    /// Follows one byte from gdb: `$` opens a packet, `#` closes it.
    fn see(&mut self, b: u8) {
        match (b, &mut self.body) {
            (b'$', _) => self.body = Some(Vec::new()),
            (b'#', Some(body)) => {
                if let Some(rest) = body.strip_prefix(b"Hc") {
                    self.noted.set(thread(rest));
                }
                self.body = None;
            }
            (_, Some(body)) if body.len() < KEEP => body.push(b),
            _ => {}
        }
    }
}

/// The thread of an `Hc` argument (`N` or `pP.N`, hex): `None` for 0
/// (any) and -1 (all).
fn thread(arg: &[u8]) -> Option<Tid> {
    let text = std::str::from_utf8(arg).ok()?;
    let tid = match text.strip_prefix('p') {
        Some(multi) => multi.split_once('.')?.1,
        None => text,
    };
    Tid::new(usize::from_str_radix(tid, 16).ok()?)
}

impl<C: Connection> Connection for Watch<C> {
    type Error = C::Error;

    fn write(&mut self, byte: u8) -> Result<(), C::Error> {
        self.inner.write(byte)
    }

    fn write_all(&mut self, buf: &[u8]) -> Result<(), C::Error> {
        self.inner.write_all(buf)
    }

    fn flush(&mut self) -> Result<(), C::Error> {
        self.inner.flush()
    }

    fn on_session_start(&mut self) -> Result<(), C::Error> {
        self.inner.on_session_start()
    }
}

impl<C: ConnectionExt> ConnectionExt for Watch<C> {
    fn read(&mut self) -> Result<u8, C::Error> {
        let b = self.inner.read()?;
        self.see(b);
        Ok(b)
    }

    fn peek(&mut self) -> Result<Option<u8>, C::Error> {
        self.inner.peek()
    }
}

#[cfg(test)]
mod tests {
    use super::thread;

    #[test]
    fn hc_arguments() {
        assert_eq!(thread(b"p1.3").map(|t| t.get()), Some(3));
        assert_eq!(thread(b"1a").map(|t| t.get()), Some(0x1a));
        assert_eq!(thread(b"p1.0"), None);
        assert_eq!(thread(b"0"), None);
        assert_eq!(thread(b"-1"), None);
        assert_eq!(thread(b"p1.-1"), None);
    }
}
