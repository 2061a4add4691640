//! The verbs, each a short sequence of store and netlink steps. A failed ADD undoes exactly
//! what it made itself (its reservation, its veth pair) and nothing it found: an ADD for an
//! attachment that exists fails before touching anything (docs/cni.md says why).

use std::fs::File;
use std::net::Ipv4Addr;

use sha2::{Digest, Sha256};

use crate::config::{self, NetConf};
use crate::ipam::{Phase, Request};
use crate::spec::{CniError, CniResult, Code, Env, Interface, IpConfig, Route, Verb};
use crate::store::Store;
use crate::world::Os;
use socialweb_netlink::{self as netlink, bridge, link, veth};

/// Environment variable that makes ADD stop (sleep) right after it reserved an address, so a
/// test can kill it there. Only with the `fault-injection` feature, which the test harness
/// turns on and the shipped plugin does not have; documented in docs/cni.md.
#[cfg(feature = "fault-injection")]
pub const FAULT_ENV: &str = "SOCIALWEB_CNI_FAULT";

/// Runs one verb. `Ok(Some(json))` is printed on stdout; `Ok(None)` prints nothing (DEL, GC).
pub fn run(env: &Env, stdin: &[u8]) -> Result<Option<serde_json::Value>, CniError> {
    if env.verb == Verb::Version {
        return Ok(Some(crate::spec::version_result()));
    }
    let conf = config::parse(stdin, env.verb)?;
    match env.verb {
        Verb::Add => add(env, &conf).map(Some),
        Verb::Del => del(env, &conf).map(|()| None),
        Verb::Check => check(env, &conf).map(|()| None),
        Verb::Status => status(&conf).map(|()| None),
        Verb::Gc => gc(&conf).map(|()| None),
        Verb::Version => unreachable!("answered above"),
    }
}

/// The host end's name: derived from the attachment, so DEL and GC find it without state.
pub fn host_veth_name(container_id: &str, ifname: &str) -> String {
    let digest = Sha256::digest(format!("{container_id}/{ifname}").as_bytes());
    let hex: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    format!("sw{}", &hex[..11])
}

fn add(env: &Env, conf: &NetConf) -> Result<serde_json::Value, CniError> {
    let netns_path = env
        .netns
        .as_deref()
        .expect("ADD has CNI_NETNS (checked by Env)");
    let netns = File::open(netns_path).map_err(|e| {
        CniError::new(
            Code::ContainerUnknown,
            format!("CNI_NETNS {netns_path}: {e}"),
        )
    })?;
    let os = Os::new();
    let me = os.me();
    let store = Store::new(&conf.data_dir, &conf.name);
    let request = Request {
        container_id: &env.container_id,
        ifname: &env.ifname,
        netns: Some(netns_path),
    };
    // Fails, saving nothing, if this attachment exists or another ADD of it runs.
    let ip = store.update(|t| {
        t.reclaim(&os);
        t.allocate(conf.subnet, conf.gateway, request, me, os.boot_id_str())
    })?;

    #[cfg(feature = "fault-injection")]
    if std::env::var(FAULT_ENV).as_deref() == Ok("hang-after-reserve") {
        eprintln!("socialweb-cni: {FAULT_ENV}=hang-after-reserve: reserved {ip}, now hanging");
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }

    let mut made_pair = false;
    let attached = attach(env, conf, &netns, ip, &mut made_pair).and_then(|result| {
        store.update(|t| Ok(t.mark_attached(&env.container_id, &env.ifname)))?;
        Ok(result)
    });
    match attached {
        Ok(result) => Ok(serde_json::to_value(
            result
                .append_to(conf.prev_result.clone())
                .for_version(&conf.cni_version),
        )
        .expect("a result serialises")),
        Err(e) => {
            // Only what this ADD made. The bridge stays: it is the node's (the agent makes
            // it), shared by every attachment, and a concurrent ADD may be using it.
            if made_pair {
                let host = host_veth_name(&env.container_id, &env.ifname);
                let _ = netlink::run::<_, _, _, CniError>(None, |h| async move {
                    Ok(link::delete(&h, &host).await?)
                });
            }
            let _ = store.update(|t| Ok(t.release_reservation(&env.container_id, &env.ifname, me)));
            Err(e)
        }
    }
}

/// Attaches the container; sets `made_pair` once the veth pair exists, so that a failure
/// after that point knows the pair is this call's to remove.
fn attach(
    env: &Env,
    conf: &NetConf,
    netns: &File,
    ip: Ipv4Addr,
    made_pair: &mut bool,
) -> Result<CniResult, CniError> {
    let host = host_veth_name(&env.container_id, &env.ifname);
    let prefix = conf.subnet.prefix_len();
    let host_name = host.as_str();
    let (bridge_mac, host_mac) = netlink::run::<_, _, _, CniError>(None, |h| async move {
        let (bridge_index, bridge_mac) =
            bridge::ensure(&h, &conf.bridge, conf.gateway, prefix, conf.mtu).await?;
        let index = match veth::create(&h, host_name, conf.mtu, netns, &env.ifname).await {
            Ok(index) => index,
            Err(e) if e.already_exists() => {
                return Err(name_taken(&h, host_name, &env.ifname, netns_of(env)).await);
            }
            Err(e) => return Err(e.into()),
        };
        *made_pair = true;
        let host_mac = veth::attach(&h, host_name, index, bridge_index, conf.hairpin).await?;
        Ok((bridge_mac, host_mac))
    })?;
    let pod_mac = netlink::run::<_, _, _, CniError>(env.netns.as_deref(), |h| async move {
        Ok(veth::configure_pod_end(
            &h,
            &env.ifname,
            ip,
            prefix,
            conf.gateway,
            conf.default_route,
            conf.mtu,
        )
        .await?)
    })?;
    let gateway = conf.gateway.to_string();
    Ok(CniResult {
        cni_version: conf.cni_version.clone(),
        interfaces: vec![
            Interface {
                name: conf.bridge.clone(),
                mac: bridge_mac,
                mtu: None,
                sandbox: String::new(),
            },
            Interface {
                name: host.clone(),
                mac: host_mac,
                mtu: Some(conf.mtu),
                sandbox: String::new(),
            },
            Interface {
                name: env.ifname.clone(),
                mac: pod_mac,
                mtu: Some(conf.mtu),
                sandbox: env.netns.clone().unwrap_or_default(),
            },
        ],
        ips: vec![IpConfig {
            address: format!("{ip}/{prefix}"),
            gateway: Some(gateway.clone()),
            interface: Some(2),
            version: None,
        }],
        routes: if conf.default_route {
            vec![Route {
                dst: "0.0.0.0/0".into(),
                gw: Some(gateway),
            }]
        } else {
            Vec::new()
        },
        dns: serde_json::Value::Null,
    })
}

fn netns_of(env: &Env) -> &str {
    env.netns.as_deref().unwrap_or_default()
}

/// Which name the kernel found taken when the pair could not be created: the host end's
/// (this attachment's, or a leftover of it) or the container's interface (the spec: ADD of an
/// interface that exists in the container fails).
async fn name_taken(h: &netlink::Handle, host: &str, ifname: &str, netns: &str) -> CniError {
    match link::index(h, host).await {
        Ok(Some(_)) => CniError::new(
            Code::AttachmentExists,
            format!("host interface {host} already exists (this attachment's host end)"),
        )
        .with_details(
            "an ADD for an attachment that exists, or a leftover of one: DEL it first; \
             nothing was changed",
        ),
        _ => CniError::new(
            Code::AttachmentExists,
            format!("{ifname} already exists in the container ({netns})"),
        )
        .with_details("nothing was changed"),
    }
}

fn del(env: &Env, conf: &NetConf) -> Result<(), CniError> {
    let store = Store::new(&conf.data_dir, &conf.name);
    store.update(|t| Ok(t.release(&env.container_id, &env.ifname)))?;
    let host = host_veth_name(&env.container_id, &env.ifname);
    // Deleting the host end deletes the pair, wherever the other end is. Only if there was no
    // host end (someone renamed or deleted it) is the container's end looked for.
    let found =
        netlink::run::<_, _, _, CniError>(
            None,
            |h| async move { Ok(link::delete(&h, &host).await?) },
        )?;
    if !found
        && let Some(ns) = env
            .netns
            .as_deref()
            .filter(|p| std::path::Path::new(p).exists())
    {
        // A namespace that cannot be entered any more is as good as gone.
        let _ = netlink::run::<_, _, _, CniError>(Some(ns), |h| async move {
            Ok(link::delete(&h, &env.ifname).await?)
        });
    }
    Ok(())
}

fn check_failed(msg: impl Into<String>) -> CniError {
    CniError::new(Code::CheckFailed, msg)
}

fn check(env: &Env, conf: &NetConf) -> Result<(), CniError> {
    let prev = conf
        .prev_result
        .as_ref()
        .ok_or_else(|| CniError::new(Code::InvalidConfig, "prevResult: is required for CHECK"))?;
    let sandbox = env.netns.as_deref().unwrap_or_default();
    let ours = prev
        .interfaces
        .iter()
        .position(|i| i.name == env.ifname && i.sandbox == sandbox)
        .ok_or_else(|| {
            check_failed(format!(
                "prevResult has no interface {} in {sandbox}",
                env.ifname
            ))
        })?;
    let want_ip = prev
        .ips
        .iter()
        .find(|ip| ip.interface == Some(ours))
        .ok_or_else(|| check_failed(format!("prevResult has no address on {}", env.ifname)))?;
    let want: ipnet::Ipv4Net = want_ip.address.parse().map_err(|_| {
        check_failed(format!(
            "prevResult address {:?} is not IPv4",
            want_ip.address
        ))
    })?;

    let table = Store::new(&conf.data_dir, &conf.name).read()?;
    match table.get(&env.container_id, &env.ifname) {
        Some(a) if a.ip == want.addr() && a.phase == Phase::Attached => {}
        Some(a) => {
            return Err(check_failed(format!(
                "the allocation table gives {} to this container, prevResult says {}",
                a.ip,
                want.addr()
            )));
        }
        None => {
            return Err(check_failed(format!(
                "no address is allocated to {}",
                env.container_id
            )));
        }
    }

    let host = host_veth_name(&env.container_id, &env.ifname);
    let ports = netlink::run::<_, _, _, CniError>(None, |h| async move {
        Ok(link::bridge_ports(&h, &conf.bridge).await?)
    })?;
    if !ports.contains(&host) {
        return Err(check_failed(format!(
            "host end {host} is not on bridge {}",
            conf.bridge
        )));
    }

    let end = netlink::run::<_, _, _, CniError>(Some(sandbox), |h| async move {
        Ok(veth::read_pod_end(&h, &env.ifname).await?)
    })?
    .ok_or_else(|| check_failed(format!("{} is missing from {sandbox}", env.ifname)))?;
    if !end.up {
        return Err(check_failed(format!("{} is down", env.ifname)));
    }
    if !end.addrs.contains(&(want.addr(), want.prefix_len())) {
        return Err(check_failed(format!(
            "{} does not hold {want} (it holds {:?})",
            env.ifname, end.addrs
        )));
    }
    let want_mac = &prev.interfaces[ours].mac;
    if !want_mac.is_empty() && *want_mac != end.mac {
        return Err(check_failed(format!(
            "{} has MAC {}, expected {want_mac}",
            env.ifname, end.mac
        )));
    }
    if conf.default_route && end.default_gateway != Some(conf.gateway) {
        return Err(check_failed(format!(
            "the default route is {:?}, expected via {}",
            end.default_gateway, conf.gateway
        )));
    }
    Ok(())
}

fn status(conf: &NetConf) -> Result<(), CniError> {
    let bridge = conf.bridge.clone();
    let present = netlink::run::<_, _, _, CniError>(None, |h| async move {
        Ok(link::by_name(&h, &bridge).await?)
    })?;
    if present.is_none() {
        return Err(CniError::new(
            Code::NotAvailable,
            format!("bridge {} is not present", conf.bridge),
        )
        .with_details("the node agent creates it once it knows this node's pod CIDR"));
    }
    let table = Store::new(&conf.data_dir, &conf.name).read()?;
    let free = table.free(conf.subnet, conf.gateway);
    if free == 0 {
        return Err(CniError::new(
            Code::NotAvailable,
            format!("no free address in {}", conf.subnet),
        ));
    }
    Ok(())
}

fn gc(conf: &NetConf) -> Result<(), CniError> {
    let valid = conf.valid_attachments.as_deref().unwrap_or_default();
    let os = Os::new();
    Store::new(&conf.data_dir, &conf.name).update(|t| {
        t.reclaim(&os);
        Ok(t.gc(valid, &os))
    })?;
    // Host ends this plugin made (sw…) for attachments nobody vouches for.
    let keep: Vec<String> = valid
        .iter()
        .map(|a| host_veth_name(&a.container_id, &a.ifname))
        .collect();
    netlink::run::<_, _, _, CniError>(None, |h| async move {
        for port in link::bridge_ports(&h, &conf.bridge).await? {
            if port.starts_with("sw") && port.len() == 13 && !keep.contains(&port) {
                let _ = link::delete(&h, &port).await?;
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_are_stable_short_and_distinct() {
        let a = host_veth_name("abc", "eth0");
        assert_eq!(a, host_veth_name("abc", "eth0"));
        assert_eq!(a.len(), 13);
        assert_ne!(a, host_veth_name("abc", "eth1"));
        assert_ne!(a, host_veth_name("abd", "eth0"));
    }
}
