//! What the control socket answers, from what the bring-up has published so far. The socket
//! serves from the agent's first second, before the mesh or DNS exist, so it is the one
//! reader that looks handles up late: each step publishes its handle here once it is done,
//! and nothing in the bring-up reads them back (the steps hand each other their handles).

use std::sync::{Arc, Mutex};

use anyhow::{Result, anyhow, bail};

use super::protocol::{PingResult, Reply, Request, Response};
use crate::dns::Dns;
use crate::mesh::Mesh;
use crate::status::{AgentStatus, Steps};
use crate::supervise::Supervisor;
use crate::tunnel::Tunnel;

/// The handles the control socket can show, set as their steps finish.
#[derive(Debug, Default)]
pub struct Published {
    mesh: Mutex<Option<Mesh>>,
    tunnel: Mutex<Option<Tunnel>>,
    dns: Mutex<Option<Arc<Dns>>>,
}

impl Published {
    pub fn mesh(&self, mesh: &Mesh) {
        *self.mesh.lock().expect("lock") = Some(mesh.clone());
    }
    pub fn tunnel(&self, tunnel: &Tunnel) {
        *self.tunnel.lock().expect("lock") = Some(tunnel.clone());
    }
    pub fn dns(&self, dns: &Arc<Dns>) {
        *self.dns.lock().expect("lock") = Some(dns.clone());
    }
}

/// Answers the control socket's requests.
#[derive(Debug)]
pub struct Handler {
    pub node: String,
    pub cluster: String,
    /// Whether this agent serves DNS at all (`--no-dns`: it says so instead of "not yet").
    pub dns_enabled: bool,
    pub steps: Arc<Steps>,
    pub children: Arc<Supervisor>,
    pub published: Arc<Published>,
}

impl super::server::Handler for Handler {
    async fn handle(&self, req: Request) -> Response {
        match self.answer(req).await {
            Ok(reply) => Response::Ok(reply),
            Err(e) => Response::Error(format!("{e:#}")),
        }
    }
}

impl Handler {
    async fn answer(&self, req: Request) -> Result<Reply> {
        Ok(match req {
            Request::Status => Reply::Status(Box::new(self.status())),
            Request::MeshStatus => Reply::MeshStatus(Box::new(self.mesh()?.status())),
            Request::MeshRoutes => Reply::MeshRoutes(self.mesh()?.routes().await?),
            Request::MeshPing { target } => {
                let (node, rtt, path) = self.mesh()?.ping(&target).await?;
                Reply::MeshPing(PingResult {
                    node,
                    rtt_ms: rtt.as_secs_f64() * 1e3,
                    path,
                })
            }
            Request::DnsStats => {
                if !self.dns_enabled {
                    bail!("node-local DNS is not running in this agent (started with --no-dns)")
                }
                let dns = self.published.dns.lock().expect("lock").clone();
                Reply::DnsStats(Box::new(dns.ok_or_else(|| self.not_yet("dns"))?.stats()))
            }
        })
    }

    fn status(&self) -> AgentStatus {
        AgentStatus {
            node: self.node.clone(),
            cluster: self.cluster.clone(),
            ready: self.steps.all_done(),
            steps: self.steps.snapshot(),
            children: self.children.status(),
            tunnel: self
                .published
                .tunnel
                .lock()
                .expect("lock")
                .as_ref()
                .map(Tunnel::status),
        }
    }

    fn mesh(&self) -> Result<Mesh> {
        let mesh = self.published.mesh.lock().expect("lock").clone();
        mesh.ok_or_else(|| self.not_yet("mesh"))
    }

    /// Why a subsystem cannot answer yet: its step's state and last error.
    fn not_yet(&self, what: &str) -> anyhow::Error {
        let step = self.steps.snapshot().into_iter().find(|st| st.name == what);
        let state = step
            .map(|st| {
                format!(
                    "{:?}{}",
                    st.state,
                    st.last_error.map(|e| format!(", {e}")).unwrap_or_default()
                )
            })
            .unwrap_or_else(|| "not part of this agent".into());
        anyhow!("the {what} is not up yet (step {what}: {state})")
    }
}
