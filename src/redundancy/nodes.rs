//! Which node each rank runs on, and who holds whose copy: pure functions
//! of the ranks' nodes, the same on every rank.

use super::Redundancy;
use crate::error::{Error, Result};

/// The node of every rank, nodes numbered 0, 1, … in the order of their
/// lowest rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nodes {
    node_of: Vec<u32>,
}

impl Nodes {
    /// From any per-rank node identifier (e.g. the lowest rank sharing the
    /// node's memory): ranks with the same identifier share a node.
    pub fn from_ids(ids: &[u64]) -> Nodes {
        let mut seen: Vec<u64> = Vec::new();
        let node_of = ids
            .iter()
            .map(|id| match seen.iter().position(|s| s == id) {
                Some(i) => i as u32,
                None => {
                    seen.push(*id);
                    (seen.len() - 1) as u32
                }
            })
            .collect();
        Nodes { node_of }
    }

    /// Ranks `0..per_node` on node 0, the next `per_node` on node 1, and so
    /// on (`ranks_per_node`: emulated nodes, or a layout MPI cannot see).
    pub fn blocks(ranks: u32, per_node: u32) -> Nodes {
        let per_node = per_node.max(1);
        Nodes { node_of: (0..ranks).map(|r| r / per_node).collect() }
    }

    /// The ranks.
    pub fn ranks(&self) -> u32 {
        self.node_of.len() as u32
    }

    /// How many nodes.
    pub fn count(&self) -> u32 {
        self.node_of.iter().max().map_or(0, |n| n + 1)
    }

    /// The node of `rank`.
    pub fn node(&self, rank: u32) -> u32 {
        self.node_of.get(rank as usize).copied().unwrap_or(0)
    }

    /// The ranks on `node`, lowest first.
    pub fn ranks_on(&self, node: u32) -> Vec<u32> {
        (0..self.ranks()).filter(|&r| self.node(r) == node).collect()
    }

    /// The position of `rank` among its node's ranks.
    pub fn local_index(&self, rank: u32) -> u32 {
        (0..rank).filter(|&r| self.node(r) == self.node(rank)).count() as u32
    }

    /// The lowest rank on `rank`'s node (it writes what the node shares).
    pub fn leader_of(&self, rank: u32) -> u32 {
        self.ranks_on(self.node(rank)).first().copied().unwrap_or(rank)
    }
}

/// Who holds whose copy, the same on every rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// No copies.
    None,
    /// `holder[r]` holds rank r's files: the rank of the same local index
    /// (modulo that node's ranks) on the next node.
    Partner {
        /// The holder of each rank's copy.
        holder: Vec<u32>,
    },
    /// Parity groups, each of ranks on distinct nodes; every member holds
    /// one parity segment of the group's files.
    Xor {
        /// The groups, each sorted.
        groups: Vec<Vec<u32>>,
    },
}

impl Plan {
    /// The plan of `scheme` over `nodes`, or why it cannot protect every
    /// rank (one node only; a rank with no peer on another node).
    pub fn new(nodes: &Nodes, scheme: Redundancy) -> Result<Plan> {
        let count = nodes.count();
        if scheme.is_some() && count < 2 {
            return Err(Error::InvalidOption(format!(
                "redundancy = \"{scheme}\" needs ranks on two nodes at least, and all {} ranks are on one (set \
                 ranks_per_node to emulate several on one machine)",
                nodes.ranks()
            )));
        }
        match scheme {
            Redundancy::None => Ok(Plan::None),
            Redundancy::Partner => {
                let holder = (0..nodes.ranks())
                    .map(|r| {
                        let next = nodes.ranks_on((nodes.node(r) + 1) % count);
                        next[nodes.local_index(r) as usize % next.len()]
                    })
                    .collect();
                Ok(Plan::Partner { holder })
            }
            Redundancy::Xor(n) => {
                // Sets of n consecutive nodes; a last set of one node joins the one before.
                let mut sets: Vec<Vec<u32>> =
                    (0..count).collect::<Vec<_>>().chunks(n as usize).map(<[u32]>::to_vec).collect();
                if sets.len() > 1 && sets.last().is_some_and(|s| s.len() < 2) {
                    let last = sets.pop().unwrap_or_default();
                    if let Some(prev) = sets.last_mut() {
                        prev.extend(last);
                    }
                }
                let mut groups = Vec::new();
                for set in &sets {
                    let on: Vec<Vec<u32>> = set.iter().map(|&node| nodes.ranks_on(node)).collect();
                    let widest = on.iter().map(Vec::len).max().unwrap_or(0);
                    for i in 0..widest {
                        let mut group: Vec<u32> = on.iter().filter_map(|ranks| ranks.get(i).copied()).collect();
                        group.sort_unstable();
                        if let [alone] = group[..] {
                            return Err(Error::InvalidOption(format!(
                                "redundancy = \"{scheme}\": rank {alone} is the only rank with local index {i} on \
                                 nodes {set:?}, so no parity group holds it on another node (use partner, or the \
                                 same number of ranks on every node)"
                            )));
                        }
                        groups.push(group);
                    }
                }
                Ok(Plan::Xor { groups })
            }
        }
    }

    /// The ranks whose partner copies `rank` holds.
    pub fn held_by(&self, rank: u32) -> Vec<u32> {
        match self {
            Plan::Partner { holder } => (0..holder.len() as u32).filter(|&r| holder[r as usize] == rank).collect(),
            _ => Vec::new(),
        }
    }

    /// The parity group of `rank` (with `rank` in it).
    pub fn group_of(&self, rank: u32) -> Option<&[u32]> {
        match self {
            Plan::Xor { groups } => groups.iter().find(|g| g.contains(&rank)).map(Vec::as_slice),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_are_numbered_by_their_lowest_rank() {
        let n = Nodes::from_ids(&[7, 7, 3, 3, 7, 9]);
        assert_eq!((0..6).map(|r| n.node(r)).collect::<Vec<_>>(), [0, 0, 1, 1, 0, 2]);
        assert_eq!((n.count(), n.local_index(4), n.leader_of(3)), (3, 2, 2));
        assert_eq!(Nodes::blocks(5, 2), Nodes::from_ids(&[0, 0, 1, 1, 2]));
    }

    /// Every rank's copy lies on another node, for every layout tried.
    #[test]
    fn a_partner_is_always_on_another_node() {
        for layout in [vec![0, 0, 1, 1], vec![0, 1, 2, 3, 4], vec![0, 0, 0, 1], vec![5, 6, 5, 6, 7, 7, 7]] {
            let nodes = Nodes::from_ids(&layout);
            let Plan::Partner { holder } = Plan::new(&nodes, Redundancy::Partner).unwrap() else { panic!() };
            for r in 0..nodes.ranks() {
                assert_ne!(nodes.node(r), nodes.node(holder[r as usize]), "{layout:?}: rank {r}");
            }
        }
        let one = Plan::new(&Nodes::blocks(4, 4), Redundancy::Partner).unwrap_err().to_string();
        assert!(one.contains("two nodes"), "{one}");
    }

    /// Groups hold every rank once, on distinct nodes, at most N nodes
    /// apart from a last set that a lone node joined.
    #[test]
    fn xor_groups_cover_every_rank_once_on_distinct_nodes() {
        let layouts: Vec<(Nodes, u32)> = [(8u32, 2u32, 4u32), (8, 1, 3), (6, 2, 2), (12, 3, 4), (5, 1, 2), (4, 2, 8)]
            .into_iter()
            .map(|(ranks, per_node, n)| (Nodes::blocks(ranks, per_node), n))
            // Nodes whose ranks interleave: groups must still come sorted.
            .chain([(Nodes::from_ids(&[5, 9, 9, 5]), 2), (Nodes::from_ids(&[1, 2, 3, 3, 2, 1]), 3)])
            .collect();
        for (nodes, n) in layouts {
            let (ranks, per_node) = (nodes.ranks(), nodes.ranks_on(0).len());
            let Plan::Xor { groups } = Plan::new(&nodes, Redundancy::Xor(n)).unwrap() else { panic!() };
            let mut seen: Vec<u32> = groups.iter().flatten().copied().collect();
            seen.sort_unstable();
            assert_eq!(seen, (0..ranks).collect::<Vec<_>>(), "{ranks}/{per_node}/{n}");
            for g in &groups {
                let mut on: Vec<u32> = g.iter().map(|&r| nodes.node(r)).collect();
                on.dedup();
                assert_eq!(on.len(), g.len(), "{g:?} shares a node");
                assert!(g.len() >= 2 && g.len() < 2 * n as usize, "{g:?}");
                assert!(g.windows(2).all(|w| w[0] < w[1]), "{g:?} is not sorted");
            }
        }
        let uneven = Plan::new(&Nodes::from_ids(&[0, 0, 1]), Redundancy::Xor(2)).unwrap_err().to_string();
        assert!(uneven.contains("rank 1 is the only rank"), "{uneven}");
    }
}
