//! One cluster's life while the broker runs: its control plane brought up (adopted after a
//! crash), the cluster mounted at the front -- first without an upstream, so its users are
//! told it is starting, then with one -- and its scale driver run until the broker stops or
//! the cluster is deleted; then the control plane is stopped (nodes and leases stay).

use std::sync::Arc;

use anyhow::Result;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::info;

use super::Clusters;
use crate::command::ClusterState;
use crate::control_plane::up::{Progress, bring_up};
use crate::front::Mount;
use crate::front::proxy::Upstream;
use crate::provision::ClusterCtx;
use crate::scale::driver::Watches;
use crate::tunnel::egress::Egress;

/// Tells a bring-up's steps through the cluster's state.
struct Starting<'a>(&'a watch::Sender<ClusterState>);

impl Progress for Starting<'_> {
    fn step(&self, detail: &str) {
        let _ = self.0.send(ClusterState::Starting {
            detail: detail.to_string(),
        });
    }
}

impl Clusters {
    /// Starts the cluster's guard (before the apiserver: it asks the guard from its first
    /// request on); the manifests the cluster gets besides the join configuration.
    async fn guarded(
        &self,
        spec: &crate::control_plane::runner::Spec,
        stop: &CancellationToken,
    ) -> Result<Vec<String>> {
        let files = spec.prepare()?;
        crate::guard::serve(
            files.guard_addr,
            &files.guard.cert,
            &files.guard.key,
            stop.clone(),
        )
        .await?;
        let mut extra = vec![crate::access::ACCESS_MANIFEST.to_string()];
        if spec.isolated {
            extra.push(crate::control_plane::NODE_ISOLATION_MANIFEST.to_string());
        }
        Ok(extra)
    }

    /// Runs the life of cluster `name` until `stop`.
    pub(super) async fn live(
        self: &Arc<Self>,
        name: &str,
        state: &watch::Sender<ClusterState>,
        stop: CancellationToken,
    ) -> Result<()> {
        let record = self
            .store
            .cluster(name)
            .await?
            .ok_or_else(|| anyhow::anyhow!("no cluster {name:?} in the store"))?;
        let mut mount = Mount {
            cluster: name.to_string(),
            account_hash: record
                .owner
                .as_deref()
                .map(socialweb_broker_core::names::account_hash),
            users_ca: self.access.users_ca_der(&self.dir_of(&record))?,
            upstream: None,
        };
        self.front.mount(mount.clone());
        let spec = self.spec(&record, self.ports(name).await?);
        let extra = self.guarded(&spec, &stop).await?;
        let Some(up) = bring_up(spec, &extra, &Starting(state), &stop).await? else {
            return Ok(());
        };
        let files = up.running.files.clone();
        tokio::spawn(crate::approver::run(
            up.client.clone(),
            name.to_string(),
            self.store.clone(),
            stop.clone(),
        ));
        let watches = Watches::start(&up.client, &stop);
        crate::tunnel::egress::serve(
            Egress {
                cluster: name.to_string(),
                tunnels: self.tunnels.clone(),
                store: self.store.clone(),
                nodes: watches.nodes.clone(),
                service_cidr: crate::control_plane::SERVICE_CIDR.parse()?,
            },
            &up.running.egress_socket,
            stop.clone(),
        )?;
        let ctx = ClusterCtx {
            name: name.to_string(),
            server_url: files.node_url.clone(),
            ca_pin: socialweb_wire::ca::pin(files.ca_pem.as_bytes()).map_err(anyhow::Error::msg)?,
            client: up.client.clone(),
        };
        // The front reaches the apiserver with a certificate only request-header
        // authentication accepts (its own CA, not the cluster's).
        mount.upstream = Some(Upstream::new(
            &files.url,
            files.ca_pem.as_bytes(),
            &std::fs::read(&files.front.cert)?,
            &std::fs::read(&files.front.key)?,
        )?);
        self.front.mount(mount);
        let _ = state.send(ClusterState::Ready);
        info!(cluster = %name, url = %files.url, kubeconfig = %files.admin_kubeconfig.display(), "cluster ready");
        crate::scale::driver::run(
            self.provisioner.clone(),
            ctx,
            self.settings.knobs,
            watches,
            stop,
        )
        .await;
        up.running.stop().await;
        Ok(())
    }
}
