//! The call graph of a profile and the inclusive cost of each call site:
//! the `calls=` lines of the callgrind output (`profile::callgrind`).
//!
//! Calls are counted exactly: a call site runs as often as its call block
//! (a tail call's `jmp` included, as callgrind counts a jump into another
//! function as a call). The callee of a direct call is the procedure at its
//! target; a call to a PLT stub goes to the stub's procedure, whose tail
//! jump goes to the import's procedure in a profiled module (found by
//! name, executable first, then the libraries in load order), as in
//! callgrind's `--skip-plt=no` graph. Indirect calls, and calls into code
//! that is not profiled, have no known callee: no line.
//!
//! An edge profile does not say which invocations of a procedure cost what,
//! so the inclusive cost `I(R)` of a procedure R (its own instructions plus
//! the cost of the calls it makes) is shared among the calls that enter it
//! in proportion to their counts (gprof's assumption), largest remainders
//! first, so that the shares sum to `I(R)` exactly. The invocations no
//! known call site explains (callbacks from untraced code, `main` from
//! libc, indirect calls) get their share on a line of their own
//! ([`CallGraph::outside`]). A share is exact when all the calls entering R
//! come from that one site (or when every invocation of R costs the same);
//! recursion: calls inside a cycle of the call graph (a strongly connected
//! component) carry no cost, and a procedure's inclusive cost adds only the
//! calls that leave its cycle.
//!
//! Invariants: the shares of the calls entering a procedure from outside
//! its cycle, plus its outside share, sum to its inclusive cost; every
//! inclusive cost is at least the procedure's own cost.

use std::collections::HashMap;

use crate::Profile;

/// A procedure: (module index in `Profile::modules`, procedure index).
pub type Node = (usize, usize);

/// One call site's calls to one callee.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallLine {
    /// The calling procedure.
    pub caller: Node,
    /// The called procedure.
    pub callee: Node,
    /// Link-time address of the call (or tail jump) instruction.
    pub site: u64,
    /// Calls made.
    pub count: u64,
    /// Their share of the callee's inclusive cost.
    pub inclusive: u64,
}

/// The call graph with inclusive costs.
#[derive(Clone, Debug, Default)]
pub struct CallGraph {
    /// Call lines, by caller in module and procedure order.
    pub calls: Vec<CallLine>,
    /// Per callee, the invocations no known call site explains and their
    /// share of its inclusive cost (only where the count is not zero).
    pub outside: Vec<(Node, u64, u64)>,
    /// The inclusive cost of every profiled procedure.
    pub inclusive: HashMap<Node, u64>,
}

/// The call graph of `p`. Empty for an every-block profile (it has no
/// invocation counts).
pub fn build(p: &Profile) -> CallGraph {
    let mods = p.modules();
    let counted = |m: usize, i: usize| {
        mods[m].procs[i]
            .counts
            .as_ref()
            .filter(|_| !mods[m].procs[i].every_block)
    };
    let mut nodes: Vec<Node> = Vec::new();
    let mut entries: Vec<HashMap<u64, usize>> = vec![HashMap::new(); mods.len()];
    let mut by_name: HashMap<&str, Node> = HashMap::new();
    for (m, module) in mods.iter().enumerate() {
        for (i, q) in module.procs.iter().enumerate() {
            if counted(m, i).is_none() {
                continue;
            }
            nodes.push((m, i));
            if let Some(b) = q.blocks.get(q.entry as usize) {
                entries[m].insert(b.start, i);
            }
            by_name.entry(q.name.as_str()).or_insert((m, i));
        }
    }
    let index: HashMap<Node, usize> = nodes.iter().enumerate().map(|(k, &n)| (n, k)).collect();
    // The edges: (caller, callee, site, count), node indices.
    let mut edges: Vec<(usize, usize, u64, u64)> = Vec::new();
    for (k, &(m, i)) in nodes.iter().enumerate() {
        let q = &mods[m].procs[i];
        let Some(c) = counted(m, i) else { continue };
        for call in &q.calls {
            let (Some(&n), Some(b)) = (
                c.blocks.get(call.block as usize),
                q.blocks.get(call.block as usize),
            ) else {
                continue;
            };
            if n == 0 {
                continue;
            }
            let callee = call
                .target
                .and_then(|t| entries[m].get(&t).map(|&j| (m, j)))
                .or_else(|| call.import.as_deref().and_then(|x| by_name.get(x).copied()));
            let Some(callee) = callee.and_then(|r| index.get(&r).copied()) else {
                continue;
            };
            let site = b.start + u64::from(b.insns.last().copied().unwrap_or(0));
            edges.push((k, callee, site, n));
        }
    }
    let comp = sccs(nodes.len(), &edges);
    let own = |k: usize| mods[nodes[k].0].procs[nodes[k].1].instructions();
    let invocations = |k: usize| counted(nodes[k].0, nodes[k].1).map_or(0, |c| c.invocations);
    let mut into: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    let mut out_of: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for (e, &(from, to, _, _)) in edges.iter().enumerate() {
        out_of[from].push(e);
        into[to].push(e);
    }
    let mut share = vec![0u64; edges.len()];
    let mut inclusive = vec![0u64; nodes.len()];
    let mut outside = Vec::new();
    // Components come callees first (Tarjan's order).
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); comp.count];
    for (k, &c) in comp.of.iter().enumerate() {
        members[c].push(k);
    }
    for group in &members {
        for &k in group {
            inclusive[k] = own(k)
                + out_of[k]
                    .iter()
                    .filter(|&&e| comp.of[edges[e].1] != comp.of[k])
                    .map(|&e| share[e])
                    .sum::<u64>();
        }
        for &k in group {
            let (inner, outer): (Vec<usize>, Vec<usize>) = into[k]
                .iter()
                .partition(|&&e| comp.of[edges[e].0] == comp.of[k]);
            let inner_calls: u64 = inner.iter().map(|&e| edges[e].3).sum();
            let known: u64 = outer.iter().map(|&e| edges[e].3).sum();
            let entered = invocations(k).saturating_sub(inner_calls).max(known);
            let rest = entered - known;
            let weights: Vec<u64> = outer
                .iter()
                .map(|&e| edges[e].3)
                .chain(std::iter::once(rest))
                .collect();
            let parts = apportion(inclusive[k], &weights);
            for (&e, &s) in outer.iter().zip(&parts) {
                share[e] = s;
            }
            if rest > 0 {
                outside.push((nodes[k], rest, parts[outer.len()]));
            }
            debug_assert!(entered == 0 || parts.iter().sum::<u64>() == inclusive[k]);
        }
    }
    let calls = edges
        .iter()
        .zip(&share)
        .map(|(&(from, to, site, count), &s)| CallLine {
            caller: nodes[from],
            callee: nodes[to],
            site,
            count,
            inclusive: s,
        })
        .collect();
    CallGraph {
        calls,
        outside,
        inclusive: nodes.iter().copied().zip(inclusive).collect(),
    }
}

/// Splits `total` in proportion to `weights` (largest remainders get the
/// units rounding left over, the first among equals first). All zero when
/// the weights are.
fn apportion(total: u64, weights: &[u64]) -> Vec<u64> {
    let sum: u128 = weights.iter().map(|&w| u128::from(w)).sum();
    if sum == 0 {
        return vec![0; weights.len()];
    }
    let t = u128::from(total);
    let mut parts: Vec<u64> = weights
        .iter()
        .map(|&w| (t * u128::from(w) / sum) as u64)
        .collect();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(t * u128::from(weights[i]) % sum));
    let left = total - parts.iter().sum::<u64>();
    for &i in order.iter().take(left as usize) {
        parts[i] += 1;
    }
    parts
}

/// Strongly connected components: `of[v]` numbers them in Tarjan's order
/// (a component after every component it reaches).
struct Sccs {
    of: Vec<usize>,
    count: usize,
}

/// Tarjan's algorithm, iterative (call graphs can be deep).
fn sccs(n: usize, edges: &[(usize, usize, u64, u64)]) -> Sccs {
    let mut succ: Vec<Vec<usize>> = vec![Vec::new(); n];
    for &(f, t, _, _) in edges {
        succ[f].push(t);
    }
    const NONE: usize = usize::MAX;
    let (mut index, mut low, mut of) = (vec![NONE; n], vec![0; n], vec![NONE; n]);
    let (mut on_stack, mut stack) = (vec![false; n], Vec::new());
    let (mut next, mut count) = (0, 0);
    for root in 0..n {
        if index[root] != NONE {
            continue;
        }
        // (vertex, next successor to look at)
        let mut work = vec![(root, 0usize)];
        index[root] = next;
        low[root] = next;
        next += 1;
        stack.push(root);
        on_stack[root] = true;
        while let Some(&mut (v, ref mut i)) = work.last_mut() {
            if let Some(&w) = succ[v].get(*i) {
                *i += 1;
                if index[w] == NONE {
                    index[w] = next;
                    low[w] = next;
                    next += 1;
                    stack.push(w);
                    on_stack[w] = true;
                    work.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(u, _)) = work.last() {
                low[u] = low[u].min(low[v]);
            }
            if low[v] == index[v] {
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    of[w] = count;
                    if w == v {
                        break;
                    }
                }
                count += 1;
            }
        }
    }
    Sccs { of, count }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apportion_sums_exactly() {
        assert_eq!(apportion(10, &[1, 1, 1]), vec![4, 3, 3]);
        assert_eq!(apportion(7, &[0, 2, 0]), vec![0, 7, 0]);
        assert_eq!(apportion(5, &[0, 0]), vec![0, 0]);
        assert_eq!(apportion(100, &[3, 1]), vec![75, 25]);
    }

    /// Naive reference: v and w share a component iff each reaches the
    /// other.
    fn reaches(n: usize, edges: &[(usize, usize, u64, u64)]) -> Vec<Vec<bool>> {
        let mut r = vec![vec![false; n]; n];
        for (v, row) in r.iter_mut().enumerate() {
            row[v] = true;
        }
        for &(f, t, _, _) in edges {
            r[f][t] = true;
        }
        for k in 0..n {
            for i in 0..n {
                for j in 0..n {
                    if r[i][k] && r[k][j] {
                        r[i][j] = true;
                    }
                }
            }
        }
        r
    }

    proptest::proptest! {
        #[test]
        fn sccs_match_mutual_reachability(
            n in 1usize..12,
            raw in proptest::collection::vec((0usize..12, 0usize..12), 0..30),
        ) {
            let edges: Vec<_> = raw.iter().map(|&(f, t)| (f % n, t % n, 0, 1)).collect();
            let s = sccs(n, &edges);
            let r = reaches(n, &edges);
            for (v, row) in r.iter().enumerate() {
                for (w, &v_reaches_w) in row.iter().enumerate() {
                    proptest::prop_assert_eq!(s.of[v] == s.of[w], v_reaches_w && r[w][v]);
                }
            }
            // Callees first: an edge never goes to a later component.
            for &(f, t, _, _) in &edges {
                proptest::prop_assert!(s.of[t] <= s.of[f]);
            }
        }
    }
}
