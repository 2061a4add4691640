//! The join's steps on the machine (`crate::join` has what they touch): containerd, the seed
//! images, trust in the control plane, the kubelet.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use anyhow::{Result, bail};

use super::{Ctx, retry};
use crate::join::config as files;
use crate::join::{self, images, trust, write_file, write_json};
use crate::mesh;
use crate::supervise::ChildSpec;

/// How long a child gets between SIGTERM and SIGKILL at shutdown.
pub const CHILD_GRACE: Duration = Duration::from_secs(10);

/// Starts a child of the agent (once, however often its step is retried) and records its
/// stop.
pub async fn start_child(cx: &Ctx, spec: ChildSpec) -> Result<()> {
    let name = spec.name.clone();
    cx.children.start(spec).await?;
    let children = cx.children.clone();
    cx.installed.record(format!("child {name}"), async move {
        children.stop(&name, CHILD_GRACE).await;
        Ok(())
    });
    Ok(())
}

pub async fn containerd(cx: &Ctx) {
    let m = &cx.config.machine;
    cx.steps
        .until_done("containerd", retry(), || async {
            let config = files::containerd_toml(m);
            write_file(&m.containerd_config(), config.as_bytes(), 0o644)?;
            let spec = ChildSpec {
                name: "containerd".into(),
                program: m.containerd.clone(),
                args: vec!["--config".into(), m.containerd_config().into()],
                log: m.log("containerd"),
            };
            start_child(cx, spec).await?;
            join::wait_socket(&m.containerd_socket(), Duration::from_secs(30)).await?;
            let socket = m.containerd_socket();
            Ok(((), Some(format!("serving {}", socket.display()))))
        })
        .await;
}

/// The images containerd should have before any Pod starts: archives in the image, then the
/// seed disk.
pub async fn images(cx: &Ctx) {
    let m = &cx.config.machine;
    let steps = cx.steps.clone();
    cx.steps
        .until_done("images", retry(), || async {
            let n = images::import_new(
                &m.ctr,
                &m.containerd_socket(),
                &m.seed_images,
                &m.images_record(),
                |line| steps.detail("images", line),
            )
            .await?;
            let total = images::archives(&m.seed_images)?.len();
            let (ctr, socket, disk, record) = (
                m.ctr.clone(),
                m.containerd_socket(),
                m.seed_disk.clone(),
                m.images_record(),
            );
            let steps = steps.clone();
            let (from_disk, on_disk) = tokio::task::spawn_blocking(move || {
                images::import_disk(&ctr, &socket, &disk, &record, |line| {
                    steps.detail("images", line)
                })
            })
            .await??;
            let disk = if on_disk > 0 {
                let path = m.seed_disk.display();
                format!("; {on_disk} on the seed disk {path}, {from_disk} imported now")
            } else {
                String::new()
            };
            let dir = m.seed_images.display();
            let detail = format!("{total} seed archives in {dir}, {n} imported now{disk}");
            Ok(((), Some(detail)))
        })
        .await;
}

/// Trust in the control plane before any secret is sent, then the join token.
pub async fn trust(cx: &Ctx) {
    let (id, m) = (&cx.id, &cx.config.machine);
    cx.steps
        .until_done("trust", retry(), || async {
            let ca = trust::trusted_ca(&id.server_url, &id.ca).await?;
            write_file(&m.ca_file(), ca.as_bytes(), 0o644)?;
            if join::kubelet_joined(m, &ca)? {
                let detail = "already joined: the kubelet holds its client certificate";
                return Ok(((), Some(detail.into())));
            }
            let user = trust::check_token(&id.server_url, &ca, &id.join_token).await?;
            let kubeconfig = files::bootstrap_kubeconfig(id, &ca);
            write_json(&m.bootstrap_kubeconfig(), &kubeconfig, 0o600)?;
            let detail = format!("CA verified; join token accepted as {user}");
            Ok(((), Some(detail)))
        })
        .await;
}

/// The kubelet, started with the node's resolv.conf and configuration; returns its node IP.
pub async fn kubelet(cx: &Ctx) -> Ipv4Addr {
    let (id, m) = (&cx.id, &cx.config.machine);
    cx.steps
        .until_done("kubelet", retry(), || async {
            let ip = node_ip(cx).await?;
            let dns = cx.config.dns.listen().map(|a| a.ip());
            let upstreams = join::upstreams(id, dns.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)));
            let resolv = files::resolv_conf(&upstreams);
            write_file(&m.resolv_conf(), resolv.as_bytes(), 0o644)?;
            let patch = m.kubelet_config_patch.as_ref();
            let config = files::kubelet_config(id, m, ip, patch);
            write_json(&m.kubelet_config_file(), &config, 0o644)?;
            let args = files::kubelet_args(id, m, ip);
            let spec = ChildSpec {
                name: "kubelet".into(),
                program: m.kubelet.clone(),
                args: args.into_iter().map(Into::into).collect(),
                log: m.log("kubelet"),
            };
            start_child(cx, spec).await?;
            Ok((ip, Some(format!("node IP {ip}"))))
        })
        .await
}

/// The kubelet's node IP: the identity's, else `--node-ip`, else the address of the default
/// route's interface.
async fn node_ip(cx: &Ctx) -> Result<Ipv4Addr> {
    Ok(match (cx.id.node_ip, cx.config.kubelet.node_ip) {
        (Some(IpAddr::V4(ip)), _) | (None, Some(ip)) => ip,
        (Some(IpAddr::V6(ip)), _) => {
            bail!("node_ip {ip}: IPv6 node addresses are not supported yet")
        }
        (None, None) => mesh::routes::default_source_v4(&mesh::routes::handle().await?).await?,
    })
}
