//! The resource graph: each machine compiles to offer search → prepare → instance
//! (→ k3s install, once clusters land), and `depends_on` adds an edge from the dependency's
//! last node to the dependent's first. Pure: no I/O.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use petgraph::algo::toposort;
use petgraph::graph::{DiGraph, NodeIndex};

use crate::config::VmSpec;

/// The stage of a machine's provisioning a node stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    OfferSearch,
    Prepare,
    Instance,
}

impl Stage {
    fn as_str(self) -> &'static str {
        match self {
            Stage::OfferSearch => "offer_search",
            Stage::Prepare => "prepare",
            Stage::Instance => "instance",
        }
    }
}

/// One node: a stage of one machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    pub vm: String,
    pub stage: Stage,
}

impl Resource {
    /// The node's address, for example `vm.dev.instance`.
    pub fn address(&self) -> String {
        format!("vm.{}.{}", self.vm, self.stage.as_str())
    }
}

/// The compiled graph.
pub struct ResourceGraph {
    pub graph: DiGraph<Resource, ()>,
}

impl ResourceGraph {
    /// Compiles machines into the graph. The config loader has already rejected cycles
    /// and dangling references; an edge to an unknown machine is skipped here.
    pub fn build(vms: &BTreeMap<String, VmSpec>) -> ResourceGraph {
        let mut graph = DiGraph::new();
        let mut first: BTreeMap<&str, NodeIndex> = BTreeMap::new();
        let mut last: BTreeMap<&str, NodeIndex> = BTreeMap::new();
        for name in vms.keys() {
            let mut prev: Option<NodeIndex> = None;
            for stage in [Stage::OfferSearch, Stage::Prepare, Stage::Instance] {
                let n = graph.add_node(Resource {
                    vm: name.clone(),
                    stage,
                });
                if let Some(p) = prev {
                    graph.add_edge(p, n, ());
                } else {
                    first.insert(name, n);
                }
                prev = Some(n);
            }
            last.insert(name, prev.expect("three stages"));
        }
        for (name, vm) in vms {
            for dep in &vm.depends_on {
                if let (Some(&from), Some(&to)) = (last.get(dep.as_str()), first.get(name.as_str()))
                {
                    graph.add_edge(from, to, ());
                }
            }
        }
        ResourceGraph { graph }
    }

    /// Renders the graph as Graphviz DOT, nodes and edges in a stable order.
    pub fn to_dot(&self) -> String {
        let mut out = String::from("digraph gpuprov {\n  rankdir = LR;\n  node [shape = box];\n");
        for n in self.graph.node_indices() {
            let _ = writeln!(out, "  \"{}\";", self.graph[n].address());
        }
        let mut edges: Vec<(String, String)> = self
            .graph
            .edge_indices()
            .filter_map(|e| self.graph.edge_endpoints(e))
            .map(|(a, b)| (self.graph[a].address(), self.graph[b].address()))
            .collect();
        edges.sort();
        for (a, b) in edges {
            let _ = writeln!(out, "  \"{a}\" -> \"{b}\";");
        }
        out.push_str("}\n");
        out
    }

    /// Machine names in an order where every machine comes after what it depends on.
    pub fn vm_order(&self) -> Vec<String> {
        let order = toposort(&self.graph, None).unwrap_or_default();
        let mut out: Vec<String> = Vec::new();
        for n in order {
            let r = &self.graph[n];
            if r.stage == Stage::Instance {
                out.push(r.vm.clone());
            }
        }
        out
    }
}
