//! `aetrace-regen`: the regenerator (paper 003, Figure 7 and Section 4.2).
