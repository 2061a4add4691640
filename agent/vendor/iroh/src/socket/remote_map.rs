use std::{
    collections::BTreeSet,
    future::poll_fn,
    hash::Hash,
    net::SocketAddr,
    sync::Arc,
    task::{Context, Poll, Waker, ready},
};

use iroh_base::{CustomAddr, EndpointAddr, EndpointId, RelayUrl};
use n0_future::task::JoinSet;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{Span, error, trace};

pub(crate) use self::remote_state::PathStateReceiver;
use self::remote_state::RemoteStateActor;
pub(super) use self::remote_state::RemoteStateMessage;
pub use self::remote_state::{
    Path, PathEvent, PathEventStream, PathList, PathListIter, PathListStream, RemoteInfo,
    TransportAddrInfo, TransportAddrUsage,
};
#[cfg(feature = "unstable-custom-transports")]
pub use self::remote_state::{
    PathSelection, PathSelectionContext, PathSelectionData, PathSelector,
};
#[cfg(not(feature = "unstable-custom-transports"))]
pub(crate) use self::remote_state::{
    PathSelection, PathSelectionContext, PathSelectionData, PathSelector,
};
use super::{
    DirectAddr, Metrics as SocketMetrics,
    mapped_addrs::{
        AddrMap, CustomMappedAddr, EndpointIdMappedAddr, MappedAddr, MultipathMappedAddr,
        RelayMappedAddr,
    },
    transports,
};
use crate::{
    address_lookup::{self, AddressLookupFailed},
    endpoint::LocalTransportAddr,
    socket::concurrent_read_map::{ConcurrentReadMap, ReadOnlyMap},
};

mod remote_state;

// TODO: use this
// /// Number of endpoints that are inactive for which we keep info about. This limit is enforced
// /// periodically via [`NodeMap::prune_inactive`].
// const MAX_INACTIVE_NODES: usize = 30;

/// Map containing all the state for endpoints.
///
/// - Has actors which each manage all the connection state for a remote endpoint.
///
/// - Has the mapped addresses we use to refer to non-IP transports destinations into IPv6
///   addressing space that is used by Noq.
#[derive(Debug)]
pub(crate) struct RemoteMap {
    /// Maps for converting between mapped and IP/relay addrs.
    pub(super) mapped_addrs: MappedAddrs,

    /// The senders for the inbox of each `RemoteStateActor` that runs.
    ///
    /// This is separated out of `Tasks` to make keeping a mutable borrow of the senders possible
    /// while we're spawning a task using another mutable borrow of `Tasks`.
    senders: ConcurrentReadMap<EndpointId, mpsc::Sender<RemoteStateMessage>>,

    /// The state kept for spawning new actors and cleaning them up.
    tasks: Tasks,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct MappedAddrs {
    /// The mapping between [`EndpointId`]s and [`EndpointIdMappedAddr`]s.
    pub(super) endpoint_addrs: AddrMap<EndpointId, EndpointIdMappedAddr>,
    /// The mapping between endpoints via a relay and their [`RelayMappedAddr`]s.
    pub(super) relay_addrs: AddrMap<(RelayUrl, EndpointId), RelayMappedAddr>,
    /// The mapping between custom transport addresses and their [`CustomMappedAddr`]s.
    pub(super) custom_addrs: AddrMap<CustomAddr, CustomMappedAddr>,
}

impl MappedAddrs {
    /// Converts a possibly mapped-IP address into a [`transports::Addr`].
    pub(crate) fn to_transport_addr(&self, addr: SocketAddr) -> Option<transports::Addr> {
        to_transport_addr(addr, &self.relay_addrs, &self.custom_addrs)
    }

    /// Converts a possibly mapped-IP 4-tuple into a [`transports::FourTuple`].
    pub(crate) fn to_transport_tuple(
        &self,
        four_tuple: &noq::FourTuple,
    ) -> Option<transports::FourTuple> {
        let remote = to_transport_addr(four_tuple.remote(), &self.relay_addrs, &self.custom_addrs)?;
        let local = LocalTransportAddr::from_noq_local_ip(
            four_tuple.local_ip(),
            &remote,
            &self.custom_addrs,
        );
        Some(transports::FourTuple::new(remote, local))
    }

    /// Converts a [`transports::FourTuple`] to a mapped-IP 4-tuple.
    pub(crate) fn to_mapped_tuple(&self, four_tuple: &transports::FourTuple) -> noq::FourTuple {
        let (remote, local) = match four_tuple {
            transports::FourTuple::Ip { remote, local } => (*remote, *local),
            transports::FourTuple::Relay { url, endpoint_id } => (
                self.relay_addrs
                    .get(&(url.clone(), *endpoint_id))
                    .private_socket_addr(),
                None,
            ),
            transports::FourTuple::Custom { remote, local } => {
                let remote = self.custom_addrs.get(remote).private_socket_addr();
                let local = local.as_ref().map(|custom_addr| {
                    self.custom_addrs
                        .get(custom_addr)
                        .private_socket_addr()
                        .ip()
                });
                (remote, local)
            }
        };
        noq::FourTuple::new(remote, local)
    }
}

/// Converts a mapped socket address to a transport address.
///
/// This takes a socket address, converts it into a [`MultipathMappedAddr`] and then tries
/// to convert the mapped address into a [`transports::Addr`].
///
/// Returns `Some` with the transport address for IP, relay, or custom mapped addresses
/// if an entry exists in the corresponding map.
///
/// Returns `None` for [`MultipathMappedAddr::Mixed`] addresses or unknown mapped addresses.
fn to_transport_addr(
    addr: impl Into<MultipathMappedAddr>,
    relay_addrs: &AddrMap<(RelayUrl, EndpointId), RelayMappedAddr>,
    custom_addrs: &AddrMap<CustomAddr, CustomMappedAddr>,
) -> Option<transports::Addr> {
    match addr.into() {
        MultipathMappedAddr::Mixed(_) => {
            error!(
                "Failed to convert addr to transport addr: Mixed mapped addr has no transport address"
            );
            None
        }
        MultipathMappedAddr::Relay(relay_mapped_addr) => {
            match relay_addrs.lookup(&relay_mapped_addr) {
                Some(parts) => Some(transports::Addr::from(parts)),
                None => {
                    error!("Failed to convert addr to transport addr: Unknown relay mapped addr");
                    None
                }
            }
        }
        MultipathMappedAddr::Custom(custom_mapped_addr) => {
            match custom_addrs.lookup(&custom_mapped_addr) {
                Some(custom_addr) => Some(transports::Addr::Custom(custom_addr)),
                None => {
                    error!("Failed to convert addr to transport addr: Unknown custom mapped addr");
                    None
                }
            }
        }
        MultipathMappedAddr::Ip(addr) => Some(transports::Addr::from(addr)),
    }
}

/// Stores the state required for starting and cleaning up the `RemoteStateActor`s.
///
/// When this is dropped, this will abort all tasks.
#[derive(Debug)]
struct Tasks {
    //
    // State required for spawning new actors.
    //
    metrics: Arc<SocketMetrics>,
    /// The "direct" addresses known for our local endpoint
    local_direct_addrs: n0_watcher::Direct<BTreeSet<DirectAddr>>,
    address_lookup: address_lookup::AddressLookupServices,
    shutdown_token: CancellationToken,

    //
    // State for task-tracking spawned actors.
    //
    /// All the `RemoteStateActor` tasks, stored inside a `JoinSet`.
    ///
    /// These tasks return their endpoint ID and the list of messages they didn't get to handle
    /// when they shut down.
    tasks: JoinSet<(EndpointId, Vec<RemoteStateMessage>)>,
    /// The waker that notifies `poll_cleanup` when the join set is populated with another task.
    poll_cleanup_waker: Option<Waker>,
    /// The path selector used by all [`RemoteStateActor`]s spawned by this map.
    path_selector: Arc<dyn PathSelector>,
    /// The tracing span for this endpoint, to be used as parent span for `RemoteStateActor` tasks.
    span: Span,
}

impl RemoteMap {
    /// Creates a new [`RemoteMap`].
    pub(super) fn new(
        metrics: Arc<SocketMetrics>,
        local_direct_addrs: n0_watcher::Direct<BTreeSet<DirectAddr>>,
        address_lookup: address_lookup::AddressLookupServices,
        shutdown_token: CancellationToken,
        path_selector: Arc<dyn PathSelector>,
        span: Span,
    ) -> Self {
        Self {
            mapped_addrs: Default::default(),
            senders: Default::default(),
            tasks: Tasks {
                metrics,
                local_direct_addrs,
                address_lookup,
                shutdown_token,
                tasks: Default::default(),
                poll_cleanup_waker: None,
                path_selector,
                span,
            },
        }
    }

    /// Cleans up terminated `RemoteStateActor` tasks.
    ///
    /// This polls for terminated actor tasks, and removes the corresponding actor sender
    /// from our sender map, or restarts the actor if it has pending messages.
    ///
    /// Resolves to the actor's remote endpoint ID whenever a `RemoteStateActor` task joined,
    /// independent of whether the task was restarted or not.
    ///
    /// Returns pending if there was no actor to be cleaned up right now, and registers
    /// for moments where this could become the case.
    ///
    /// This function should be called in a loop to clean up expired tasks.
    /// Only one task is allowed to poll this function concurrently.
    pub(super) async fn cleanup(&mut self) -> EndpointId {
        loop {
            let (remote_id, leftover_messages) = poll_fn(|cx| self.poll_join_next(cx)).await;
            if self.remove_or_restart_actor(remote_id, leftover_messages) {
                return remote_id;
            }
        }
    }

    /// Polls for the next joined actor task.
    ///
    /// Returns [`Poll::Pending`] if no tasks are running, and is woken when the task set changes.
    fn poll_join_next(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<(EndpointId, Vec<RemoteStateMessage>)> {
        while let Some(result) = ready!(self.tasks.tasks.poll_join_next(cx)) {
            match result {
                Ok((remote_id, leftover_msgs)) => {
                    return Poll::Ready((remote_id, leftover_msgs));
                }
                Err(err) => {
                    if let Ok(panic) = err.try_into_panic() {
                        error!("RemoteStateActor panicked.");
                        std::panic::resume_unwind(panic);
                    }
                }
            }
        }
        // There's nothing to clean up.
        // Let's get woken when there's another task.
        // If we're called after that, then we'll fall into `poll_join_next` and
        // properly wait for a task to finish.
        self.tasks.poll_cleanup_waker.replace(cx.waker().clone());
        Poll::Pending
    }

    /// Removes an actor sender if `leftover_msgs` is empty, or restarts the actor otherwise.
    fn remove_or_restart_actor(
        &mut self,
        remote_id: iroh_base::PublicKey,
        leftover_msgs: Vec<RemoteStateMessage>,
    ) -> bool {
        if leftover_msgs.is_empty() {
            // the actor shut down cleanly
            self.senders.remove(&remote_id);
            trace!(%remote_id, "cleaned up RemoteStateActor");
            true
        } else {
            // The remote actor got messages while it was closing, so we're restarting
            trace!(%remote_id, "restarting terminated RemoteStateActor: messages received during shutdown");
            let sender =
                self.tasks
                    .start_remote_state_actor(remote_id, leftover_msgs, &self.mapped_addrs);
            // We don't have to be careful about guards - only one thread is modifying this hashmap at a time.
            self.senders.insert(remote_id, sender);
            false
        }
    }

    pub(super) fn on_network_change(&mut self, is_major: bool) {
        let read = self.senders.read_only();
        let guard = read.guard();
        for sender in read.values(&guard) {
            sender
                .try_send(RemoteStateMessage::NetworkChange { is_major })
                .ok();
        }
    }

    pub(super) async fn resolve_remote(
        &mut self,
        addr: EndpointAddr,
        tx: oneshot::Sender<Result<(), AddressLookupFailed>>,
    ) {
        let EndpointAddr { id, addrs } = addr;
        self.send_to_actor(id, RemoteStateMessage::ResolveRemote(addrs, tx))
            .await
    }

    pub(super) async fn add_connection(
        &mut self,
        remote: EndpointId,
        conn: noq::Connection,
        tx: oneshot::Sender<PathStateReceiver>,
    ) {
        self.send_to_actor(remote, RemoteStateMessage::AddConnection(conn, tx))
            .await
    }

    /// Sends a message to a `RemoteStateActor`, starting it if not running already.
    ///
    /// When sending fails, the actor must be terminating, in which case we wait for its task to
    /// join and then restart the sender.
    async fn send_to_actor(&mut self, remote_id: EndpointId, message: RemoteStateMessage) {
        let sender = self.senders.get_or_insert_with(remote_id, || {
            self.tasks
                .start_remote_state_actor(remote_id, vec![], &self.mapped_addrs)
        });

        if let Err(mpsc::error::SendError(message)) = sender.send(message).await {
            // The send failed, which means the RemoteStateActor is terminating. We call the cleanup
            // function so that its task is processed. This ensures that the leftover messages are
            // properly enqueued into a new actor, and that a later cleanup does not reap a newly
            // created sender again.  We can be sure that the task has not been cleaned up yet
            // because we take a `&mut self` reference.
            loop {
                let (id, leftover_messages) = poll_fn(|cx| self.poll_join_next(cx)).await;
                if id != remote_id {
                    self.remove_or_restart_actor(id, leftover_messages);
                } else {
                    let mut messages = leftover_messages;
                    messages.push(message);
                    self.remove_or_restart_actor(id, messages);
                    break;
                }
            }
        }
    }

    pub(super) fn senders(&self) -> ReadOnlyMap<EndpointId, mpsc::Sender<RemoteStateMessage>> {
        self.senders.read_only()
    }
}

impl Tasks {
    /// Starts a new remote state actor and returns a handle and a sender.
    ///
    /// The handle is not inserted into the endpoint map, this must be done by the caller of this function.
    fn start_remote_state_actor(
        &mut self,
        eid: EndpointId,
        initial_msgs: Vec<RemoteStateMessage>,
        mapped_addrs: &MappedAddrs,
    ) -> mpsc::Sender<RemoteStateMessage> {
        // Ensure there is a RemoteMappedAddr for this EndpointId.
        mapped_addrs.endpoint_addrs.get(&eid);
        let sender = RemoteStateActor::new(
            eid,
            self.local_direct_addrs.clone(),
            mapped_addrs.clone(),
            self.metrics.clone(),
            self.address_lookup.clone(),
            self.path_selector.clone(),
        )
        .start(
            initial_msgs,
            &mut self.tasks,
            self.shutdown_token.clone(),
            self.span.clone(),
        );
        if let Some(waker) = self.poll_cleanup_waker.take() {
            // Notify something waiting for changes to tasks when there's a new task.
            waker.wake();
        }
        sender
    }
}

/// The origin or *source* through which an address associated with a remote endpoint
/// was discovered.
///
/// An aggregate of the [`Source`]s of all the addresses of an endpoint describe the
/// [`Source`]s of the endpoint itself.
///
/// A [`Source`] helps track how and where an address was learned. Multiple
/// sources can be associated with a single address, if we have discovered this
/// address through multiple means.
#[derive(Serialize, Deserialize, strum::Display, Debug, Clone, Eq, PartialEq, Hash)]
#[strum(serialize_all = "kebab-case")]
#[allow(private_interfaces)]
#[non_exhaustive]
pub(crate) enum Source {
    /// Application layer added the address directly.
    App,
    /// The address was discovered by an Address Lookup system
    #[strum(serialize = "{name}")]
    AddressLookup {
        /// The name of the Address Lookup that discovered the address.
        name: String,
    },
    /// The address was added as a path within a connection.
    Connection,
}

