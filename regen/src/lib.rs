//! `aetrace-regen`: the dynamic side (paper 003, Figure 7 and Section 4.2;
//! DESIGN.md decision 7).
//!
//! Not written yet: the regenerator needs the rewriter's trace files (issue 4).
//! The reference regenerator it will be tested against already lives in
//! `aetrace-graph`.
