//! The signal handlers a thread is in, as [`visit`]'s [`Event::Signal`]
//! enters them and [`Event::SigReturn`] leaves them: what each delivery
//! saved of the code it interrupted, by its SIGNAL record's stream
//! offset. One rule for every reader of a handler's data values (the data
//! walk, `aetrace`'s `dataout::signals`, and the debugger's value cursor,
//! `aetrace-debug`'s `data`): a delivery saves; a return gives back the
//! save of its own SIGNAL and drops the saves of the handlers entered
//! after it, which never returned (`siglongjmp`).
//!
//! Invariant: saves are in delivery order, the innermost last.
//!
//! [`visit`]: crate::visit
//! [`Event::Signal`]: crate::visit::Event::Signal
//! [`Event::SigReturn`]: crate::visit::Event::SigReturn

/// The saves of the handlers entered and not returned, the oldest first.
#[derive(Clone, Debug)]
pub struct Handlers<T>(Vec<(u64, T)>);

impl<T> Default for Handlers<T> {
    fn default() -> Self {
        Handlers(Vec::new())
    }
}

impl<T> Handlers<T> {
    /// The handler of the SIGNAL record at stream offset `offset` was
    /// entered, the interrupted code's `saved`.
    pub fn enter(&mut self, offset: u64, saved: T) {
        self.0.push((offset, saved));
    }

    /// No handler entered and not returned.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The handler of the SIGNAL record at `offset` returned: its save
    /// (the latest entry of that SIGNAL), the saves after it dropped; none
    /// if no handler of it was entered.
    pub fn returned(&mut self, offset: u64) -> Option<T> {
        let i = self.0.iter().rposition(|s| s.0 == offset)?;
        self.0.truncate(i + 1);
        self.0.pop().map(|s| s.1)
    }
}

#[cfg(test)]
mod tests {
    use super::Handlers;

    #[test]
    fn a_return_drops_the_handlers_entered_after_it() {
        let mut h = Handlers::default();
        h.enter(10, 'a');
        h.enter(20, 'b');
        h.enter(30, 'c');
        assert_eq!(h.returned(25), None);
        // 30's handler never returned (it jumped out into 20's caller).
        assert_eq!(h.returned(20), Some('b'));
        assert_eq!(h.returned(30), None);
        assert_eq!(h.returned(10), Some('a'));
        assert_eq!(h.returned(10), None);
    }
}
