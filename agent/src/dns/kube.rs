//! The cluster zone's data from the API: Services and EndpointSlices (all namespaces), and
//! the Pods on this node only (their addresses tell the server which namespace a query comes
//! from, for the search-path shortcut, without watching every Pod in the cluster).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Service as KService};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, ResourceExt};
use tracing::{info, warn};

use super::server::Dns;
use socialweb_dns_core::store::{Endpoint, Port, Service, ServiceKind, Slice, Store};

/// Whether the reflector's store holds a complete state after this event: not while a
/// (re)list is under way, when the store still holds the previous state and swaps the new one
/// in at `InitDone`.
fn settled<K>(e: &watcher::Event<K>) -> bool {
    !matches!(e, watcher::Event::Init | watcher::Event::InitApply(_))
}

/// A Service as the store wants it; `None` for what DNS ignores (no name, no spec).
pub fn service_of(s: &KService) -> Option<Service> {
    let spec = s.spec.as_ref()?;
    let kind = if spec.type_.as_deref() == Some("ExternalName") {
        ServiceKind::ExternalName(spec.external_name.clone()?)
    } else if spec.cluster_ip.as_deref() == Some("None") {
        ServiceKind::Headless
    } else {
        let ips: Vec<IpAddr> = spec
            .cluster_ips
            .clone()
            .or_else(|| spec.cluster_ip.clone().map(|c| vec![c]))
            .unwrap_or_default()
            .iter()
            .filter_map(|ip| ip.parse().ok())
            .collect();
        if ips.is_empty() {
            return None;
        }
        ServiceKind::ClusterIp(ips)
    };
    Some(Service {
        namespace: s.namespace()?,
        name: s.metadata.name.clone()?,
        kind,
        ports: spec
            .ports
            .iter()
            .flatten()
            .map(|p| port(&p.name, &p.protocol, Some(p.port)))
            .collect(),
        publish_not_ready: spec.publish_not_ready_addresses.unwrap_or(false),
    })
}

/// A port of a Service or an EndpointSlice (protocol TCP when unset, as the API defaults).
fn port(name: &Option<String>, protocol: &Option<String>, number: Option<i32>) -> Port {
    Port {
        name: name.clone().filter(|n| !n.is_empty()),
        protocol: protocol.clone().unwrap_or_else(|| "TCP".into()),
        port: number.and_then(|p| u16::try_from(p).ok()).unwrap_or(0),
    }
}

/// An EndpointSlice as the store wants it, keyed by its own name.
pub fn slice_of(s: &EndpointSlice) -> Option<(String, Slice)> {
    let service = s.labels().get("kubernetes.io/service-name")?.clone();
    Some((
        s.metadata.name.clone()?,
        Slice {
            namespace: s.namespace()?,
            service,
            ports: s
                .ports
                .iter()
                .flatten()
                .map(|p| port(&p.name, &p.protocol, p.port))
                .collect(),
            endpoints: s
                .endpoints
                .iter()
                .map(|e| Endpoint {
                    addresses: e.addresses.iter().filter_map(|a| a.parse().ok()).collect(),
                    ready: e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true),
                    hostname: e.hostname.clone(),
                })
                .collect(),
        },
    ))
}

/// Keeps `dns`'s snapshot and pod map in line with the cluster until the process ends.
pub fn watch(client: Client, node: String, zone: String, dns: Arc<Dns>) {
    let pods: Api<Pod> = Api::all(client.clone());
    watch_zone(client, zone, dns.clone());
    tokio::spawn(follow_pods(pods, node, dns));
}

/// The cluster zone from every Service and EndpointSlice, rebuilt on each change.
fn watch_zone(client: Client, zone: String, dns: Arc<Dns>) {
    let services: Api<KService> = Api::all(client.clone());
    let slices: Api<EndpointSlice> = Api::all(client);
    let (svc_store, svc_writer) = reflector::store();
    let (slice_store, slice_writer) = reflector::store();
    let svc_stream = reflector(
        svc_writer,
        watcher(services, watcher::Config::default()).default_backoff(),
    )
    .map(|r| r.map(|e| settled(&e)));
    let slice_stream = reflector(
        slice_writer,
        watcher(slices, watcher::Config::default()).default_backoff(),
    )
    .map(|r| r.map(|e| settled(&e)));
    let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1);
    for stream in [svc_stream.boxed(), slice_stream.boxed()] {
        let tx = tx.clone();
        tokio::spawn(async move {
            futures_util::pin_mut!(stream);
            while let Some(event) = stream.next().await {
                match event {
                    Err(e) => {
                        warn!("watching Services/EndpointSlices: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                    }
                    // Mid-list: the store swaps the new state in at the end of the list.
                    Ok(false) => continue,
                    Ok(true) => {}
                }
                let _ = tx.try_send(());
            }
        });
    }
    // Rebuild on every change (a pending signal coalesces bursts): a new Service answers
    // within milliseconds of the watch event.
    let rebuild = dns.clone();
    tokio::spawn(async move {
        while rx.recv().await.is_some() {
            let mut store = Store::default();
            store.replace(
                svc_store
                    .state()
                    .iter()
                    .filter_map(|s| service_of(s))
                    .collect(),
                slice_store
                    .state()
                    .iter()
                    .filter_map(|s| slice_of(s))
                    .collect(),
            );
            let snap = store.snapshot(&zone);
            let names = snap.names();
            rebuild.set_snapshot(snap);
            tracing::debug!(names, "cluster zone rebuilt");
        }
    });
}

/// This node's Pods' addresses and namespaces (autopath's search list comes from them).
async fn follow_pods(pods: Api<Pod>, node: String, dns: Arc<Dns>) {
    let cfg = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let (pod_store, pod_writer) = reflector::store();
    let stream = reflector(pod_writer, watcher(pods, cfg).default_backoff());
    futures_util::pin_mut!(stream);
    let mut last = BTreeMap::new();
    while let Some(event) = stream.next().await {
        match event {
            Err(e) => {
                warn!("watching this node's Pods: {e}");
                continue;
            }
            Ok(e) if !settled(&e) => continue,
            Ok(_) => {}
        }
        let map = namespaces_by_ip(&pod_store.state());
        if map != last {
            info!(pods = map.len(), "pods on this node changed");
            dns.pods
                .store(Arc::new(map.clone().into_iter().collect::<HashMap<_, _>>()));
            last = map;
        }
    }
}

/// Each Pod's addresses with its namespace, leaving out host-network Pods (their address is
/// the node's).
fn namespaces_by_ip(pods: &[Arc<Pod>]) -> BTreeMap<IpAddr, String> {
    pods.iter()
        .filter(|p| {
            !p.spec
                .as_ref()
                .and_then(|s| s.host_network)
                .unwrap_or(false)
        })
        .flat_map(|p| {
            let ns = p.namespace().unwrap_or_default();
            p.status
                .as_ref()
                .and_then(|s| s.pod_ips.clone())
                .unwrap_or_default()
                .into_iter()
                .filter_map(move |ip| ip.ip.parse().ok().map(|ip| (ip, ns.clone())))
        })
        .collect()
}
