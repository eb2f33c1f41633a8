//! The resource graph: each machine compiles to offer search → prepare → instance
//! (→ k3s install, once clusters land), and `depends_on` adds an edge from the dependency's
//! last node to the dependent's first. The shared objects of the machines' clouds
//! ([`crate::provider::shared::declared`]: a project key per account, an environment per
//! region) are nodes of their own, once each, with an edge to the `prepare` of every
//! machine that may use them, and an edge from an earlier kind to a later one of the same
//! region (a Hyperstack key pair lives in its environment); a region-scoped object of a
//! machine with no `regions`, or with several clouds (the plan cannot tell which cloud
//! has which of its regions), is `[*]`: its region is chosen at launch. Pure: no I/O.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use petgraph::algo::toposort;
use petgraph::graph::{DiGraph, NodeIndex};

use crate::config::VmSpec;
use crate::provider::SharedObject;

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

/// One node: a stage of one machine, or a shared object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resource {
    Vm {
        vm: String,
        stage: Stage,
    },
    /// A shared object's address, for example `shared.digitalocean.ssh_key`.
    Shared {
        address: String,
    },
}

impl Resource {
    /// The node's address, for example `vm.dev.instance`.
    pub fn address(&self) -> String {
        match self {
            Resource::Vm { vm, stage } => format!("vm.{vm}.{}", stage.as_str()),
            Resource::Shared { address } => address.clone(),
        }
    }
}

/// The addresses of the shared objects `vm` may use, in the order they are prepared
/// (`[*]` for a region-scoped object unless the machine names exactly one region and one
/// cloud: the region is then chosen at launch).
pub fn shared_addresses(vm: &VmSpec) -> Vec<String> {
    use crate::provider::shared::{declared, SharedScope};
    let mut out = Vec::new();
    for cloud in &vm.clouds {
        for k in declared(cloud.as_str()) {
            let regions: Vec<Option<String>> = match k.scope {
                SharedScope::Account => vec![None],
                // No region, several (the launch uses one of them, so planning each would
                // overcount), or regions shared by several clouds (which cloud has which
                // region is known only from the offers): chosen at launch.
                SharedScope::Region if vm.regions.len() != 1 || vm.clouds.len() > 1 => {
                    vec![Some("*".into())]
                }
                SharedScope::Region => vm.regions.iter().cloned().map(Some).collect(),
            };
            for region in regions {
                let a = SharedObject {
                    cloud: cloud.as_str().to_string(),
                    kind: k.kind.to_string(),
                    region,
                }
                .address();
                if !out.contains(&a) {
                    out.push(a);
                }
            }
        }
    }
    out
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
        let mut shared: BTreeMap<String, NodeIndex> = BTreeMap::new();
        for (name, vm) in vms {
            let mut prev: Option<NodeIndex> = None;
            for stage in [Stage::OfferSearch, Stage::Prepare, Stage::Instance] {
                let n = graph.add_node(Resource::Vm {
                    vm: name.clone(),
                    stage,
                });
                if let Some(p) = prev {
                    graph.add_edge(p, n, ());
                } else {
                    first.insert(name, n);
                }
                if stage == Stage::Prepare {
                    let addresses = shared_addresses(vm);
                    for address in &addresses {
                        let s = *shared.entry(address.clone()).or_insert_with(|| {
                            graph.add_node(Resource::Shared {
                                address: address.clone(),
                            })
                        });
                        graph.add_edge(s, n, ());
                    }
                    // A later kind lives in an earlier one of its region (a key pair in
                    // its environment): prepared after it, released before it.
                    for a in &addresses {
                        for b in &addresses {
                            let (Some(oa), Some(ob)) =
                                (SharedObject::parse(a), SharedObject::parse(b))
                            else {
                                continue;
                            };
                            if ob.lives_in(&oa) {
                                graph.update_edge(shared[a], shared[b], ());
                            }
                        }
                    }
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
            if let Resource::Vm {
                vm,
                stage: Stage::Instance,
            } = &self.graph[n]
            {
                out.push(vm.clone());
            }
        }
        out
    }
}
