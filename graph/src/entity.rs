//! Typed indices and the dense side tables keyed by them (Cranelift's
//! `PrimaryMap`/`SecondaryMap` idea).
//!
//! Invariants: an index is only ever created by the `PrimaryMap` that owns the
//! entities (or by `EntityRef::new` on a value that map handed out), so
//! indexing a `PrimaryMap` with its own keys never fails. A `SecondaryMap`
//! holds a value for every key, growing on demand and answering the default
//! for keys it has not seen.

use std::fmt;
use std::marker::PhantomData;
use std::ops::{Index, IndexMut};

/// A dense `u32` index naming one entity.
pub trait EntityRef: Copy + Eq + Ord + std::hash::Hash + fmt::Debug {
    /// The index with position `index` (which must fit in a `u32`).
    fn new(index: usize) -> Self;
    /// The index's position in its dense table.
    fn index(self) -> usize;
}

/// Declares a typed index: `entity!(pub struct BlockId, "block");`
#[macro_export]
macro_rules! entity {
    ($(#[$attr:meta])* $vis:vis struct $name:ident, $prefix:expr) => {
        $(#[$attr])*
        #[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        $vis struct $name(u32);

        impl $crate::entity::EntityRef for $name {
            #[inline]
            fn new(index: usize) -> Self {
                debug_assert!(index < u32::MAX as usize, "index overflow");
                $name(index as u32)
            }
            #[inline]
            fn index(self) -> usize {
                self.0 as usize
            }
        }

        impl $name {
            /// The raw number, for output formats and diagnostics.
            #[inline]
            pub fn as_u32(self) -> u32 {
                self.0
            }
            /// The index with this raw number.
            #[inline]
            pub fn from_u32(raw: u32) -> Self {
                $name(raw)
            }
        }

        impl ::std::fmt::Debug for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                write!(f, "{}{}", $prefix, self.0)
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                write!(f, "{}{}", $prefix, self.0)
            }
        }
    };
}

/// Owns a dense sequence of entities and hands out their indices.
#[derive(Clone, PartialEq, Eq)]
pub struct PrimaryMap<K: EntityRef, V> {
    elems: Vec<V>,
    unused: PhantomData<K>,
}

impl<K: EntityRef, V> PrimaryMap<K, V> {
    /// An empty map.
    pub fn new() -> Self {
        Self {
            elems: Vec::new(),
            unused: PhantomData,
        }
    }
    /// An empty map with room for `n` entities.
    pub fn with_capacity(n: usize) -> Self {
        Self {
            elems: Vec::with_capacity(n),
            unused: PhantomData,
        }
    }
    /// Adds an entity and returns its new index.
    pub fn push(&mut self, value: V) -> K {
        let k = K::new(self.elems.len());
        self.elems.push(value);
        k
    }
    /// The index the next `push` will return.
    pub fn next_key(&self) -> K {
        K::new(self.elems.len())
    }
    /// The number of entities.
    pub fn len(&self) -> usize {
        self.elems.len()
    }
    /// Whether the map holds no entity.
    pub fn is_empty(&self) -> bool {
        self.elems.is_empty()
    }
    /// The entity at `k`, or `None` if `k` is out of range.
    pub fn get(&self, k: K) -> Option<&V> {
        self.elems.get(k.index())
    }
    /// Whether `k` names an entity of this map.
    pub fn is_valid(&self, k: K) -> bool {
        k.index() < self.elems.len()
    }
    /// Every index, in order.
    pub fn keys(&self) -> impl DoubleEndedIterator<Item = K> + ExactSizeIterator + use<K, V> {
        (0..self.elems.len()).map(K::new)
    }
    /// The entities, in index order.
    pub fn values(&self) -> std::slice::Iter<'_, V> {
        self.elems.iter()
    }
    /// Every (index, entity) pair, in index order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (K, &V)> + ExactSizeIterator {
        self.elems.iter().enumerate().map(|(i, v)| (K::new(i), v))
    }
    /// Every (index, entity) pair mutably, in index order.
    pub fn iter_mut(&mut self) -> impl DoubleEndedIterator<Item = (K, &mut V)> + ExactSizeIterator {
        self.elems
            .iter_mut()
            .enumerate()
            .map(|(i, v)| (K::new(i), v))
    }
    /// The entities as a slice indexed by position.
    pub fn as_slice(&self) -> &[V] {
        &self.elems
    }
}

impl<K: EntityRef, V> Default for PrimaryMap<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: EntityRef, V: fmt::Debug> fmt::Debug for PrimaryMap<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<K: EntityRef, V> Index<K> for PrimaryMap<K, V> {
    type Output = V;
    #[inline]
    fn index(&self, k: K) -> &V {
        &self.elems[k.index()]
    }
}

impl<K: EntityRef, V> IndexMut<K> for PrimaryMap<K, V> {
    #[inline]
    fn index_mut(&mut self, k: K) -> &mut V {
        &mut self.elems[k.index()]
    }
}

impl<K: EntityRef, V> FromIterator<V> for PrimaryMap<K, V> {
    fn from_iter<I: IntoIterator<Item = V>>(iter: I) -> Self {
        Self {
            elems: iter.into_iter().collect(),
            unused: PhantomData,
        }
    }
}

/// A side table giving every key of some `PrimaryMap` a value (default until set).
#[derive(Clone, PartialEq, Eq)]
pub struct SecondaryMap<K: EntityRef, V: Clone> {
    elems: Vec<V>,
    default: V,
    unused: PhantomData<K>,
}

impl<K: EntityRef, V: Clone + Default> SecondaryMap<K, V> {
    /// An empty table answering `V::default()` for every key.
    pub fn new() -> Self {
        Self::with_default(V::default())
    }
}

impl<K: EntityRef, V: Clone + Default> Default for SecondaryMap<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: EntityRef, V: Clone> SecondaryMap<K, V> {
    /// An empty table answering `default` for every key.
    pub fn with_default(default: V) -> Self {
        Self {
            elems: Vec::new(),
            default,
            unused: PhantomData,
        }
    }
    /// A table already sized for `n` keys, all holding `default`.
    pub fn filled(n: usize, default: V) -> Self {
        Self {
            elems: vec![default.clone(); n],
            default,
            unused: PhantomData,
        }
    }
    /// The value of `k` (the default if it was never set).
    pub fn get(&self, k: K) -> &V {
        self.elems.get(k.index()).unwrap_or(&self.default)
    }
    /// The number of keys stored so far (keys beyond answer the default).
    pub fn len(&self) -> usize {
        self.elems.len()
    }
    /// Whether no key has been stored yet.
    pub fn is_empty(&self) -> bool {
        self.elems.is_empty()
    }
    /// Every stored (key, value) pair, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (K, &V)> {
        self.elems.iter().enumerate().map(|(i, v)| (K::new(i), v))
    }
    /// The stored values, in key order.
    pub fn values(&self) -> std::slice::Iter<'_, V> {
        self.elems.iter()
    }
}

impl<K: EntityRef, V: Clone + fmt::Debug> fmt::Debug for SecondaryMap<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<K: EntityRef, V: Clone> Index<K> for SecondaryMap<K, V> {
    type Output = V;
    #[inline]
    fn index(&self, k: K) -> &V {
        self.get(k)
    }
}

impl<K: EntityRef, V: Clone> IndexMut<K> for SecondaryMap<K, V> {
    #[inline]
    fn index_mut(&mut self, k: K) -> &mut V {
        let i = k.index();
        if i >= self.elems.len() {
            self.elems.resize(i + 1, self.default.clone());
        }
        &mut self.elems[i]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    crate::entity!(struct E, "e");

    #[test]
    fn primary_and_secondary() {
        let mut p: PrimaryMap<E, &str> = PrimaryMap::new();
        let a = p.push("a");
        let b = p.push("b");
        assert_eq!(p[b], "b");
        assert_eq!(format!("{a}"), "e0");
        assert_eq!(E::from_u32(b.as_u32()), b);
        let mut s: SecondaryMap<E, u32> = SecondaryMap::new();
        assert_eq!(s[b], 0);
        s[b] = 7;
        assert_eq!(s[b], 7);
        assert_eq!(s[a], 0);
    }
}
