//! A lease's node as a qemu guest (`machine = "vm"`): its disks made and qemu started on a
//! blocking thread; its state followed from the status port and the process (booting until
//! the agent says `ready`; failed, with the console's last lines, when the guest ends or its
//! boot times out); powered off and its disks removed when released. A provider that
//! restarts adopts the guests whose qemu still runs.

use anyhow::{Context, Result};
use socialweb_market::{LeaseState, NodeSpec};
use socialweb_wire::guest::Event;
use tracing::{info, warn};

use crate::book::{LeaseEntry, set_state};
use crate::jail::{self, Jail};
use crate::vm::{self, GuestFiles, GuestRecord};
use crate::{MachineKind, Provider, failpoint};

/// Console lines a failed lease's reason carries.
const CONSOLE_LINES: usize = 12;

impl Provider {
    fn vm_settings(&self) -> &vm::VmSettings {
        match &self.inner.cfg.machine {
            MachineKind::Vm(s) => s,
            MachineKind::Namespace => unreachable!("a guest of a provider of namespaces"),
        }
    }

    /// The node size its RFP asked for.
    pub(crate) fn spec_of(&self, e: &LeaseEntry) -> NodeSpec {
        self.inner.ledger.read(|b| {
            b.rfps
                .get(&e.lease.rfp_id)
                .map(|r| r.req.spec)
                .unwrap_or_else(|| self.inner.cfg.largest_shape())
        })
    }

    /// The jail of a lease's guest (made only when `local_provider.vm.jail` is on; removing
    /// it is harmless either way).
    pub(crate) fn jail_of(&self, e: &LeaseEntry) -> Jail {
        let c = &self.inner.cfg;
        Jail::plan(&c.prefix, c.subnet, e.slot, &self.node_dir(&e.lease.id))
    }

    /// Makes the guest's disks and jail and starts it (blocking).
    pub(crate) fn boot_guest(&self, e: &LeaseEntry) -> Result<GuestRecord> {
        let s = self.vm_settings();
        let image = self.inner.image.as_ref().context("no node image")?;
        let (accel, _) = self.inner.accel.clone().context("no accelerator chosen")?;
        let spec = self.spec_of(e);
        let files = GuestFiles {
            dir: self.node_dir(&e.lease.id),
        };
        vm::kill_leftover(&files);
        let _ = std::fs::remove_dir_all(&files.dir);
        std::fs::create_dir_all(&files.dir)?;
        vm::make_disks(
            s,
            image,
            &files,
            spec.disk_mib,
            &serde_json::to_vec_pretty(&e.identity)?,
        )?;
        // The tests' guest that never reports: a kernel whose init exits, so it panics.
        let extra = if failpoint("provider::guest_panics") {
            "init=/bin/false"
        } else {
            ""
        };
        let jail = s.jail.then(|| self.jail_of(e));
        let cgroup = match &jail {
            Some(j) => Some(j.create(&jail::budget(&spec, accel == vm::Accel::Tcg))?),
            None => None,
        };
        let g = vm::start(
            s,
            image,
            &spec,
            accel,
            &files,
            jail.as_ref().zip(cgroup.as_ref()),
            extra,
        )?;
        info!(lease = %e.lease.id, pid = g.pid, accel = accel.as_str(), vcpu = spec.vcpu,
              mem_mib = spec.mem_mib, disk_mib = spec.disk_mib, uid = jail.as_ref().map(|j| j.uid),
              "local provider: guest booting");
        Ok(g)
    }

    /// Fails a guest's lease with `why` and the console's last lines.
    fn fail_guest(&self, id: &str, g: &GuestRecord, why: &str) {
        let tail = vm::console_tail(&g.files(), CONSOLE_LINES);
        let panic = vm::panic_line(&g.files())
            .map(|l| format!(" (the kernel panicked: {l})"))
            .unwrap_or_default();
        let reason = format!("{why}{panic}; the console's last lines:\n{tail}");
        warn!(lease = %id, "local provider: {reason}");
        self.inner.ledger.update(id, |x| {
            set_state(&mut x.lease, LeaseState::Failed, Some(reason))
        });
    }

    /// One look at a live lease's guest.
    pub(crate) fn look_at_guest(&self, e: &LeaseEntry, g: &GuestRecord) {
        let id = &e.lease.id;
        if !g.running() {
            let why = match e.lease.state {
                LeaseState::Booting => "the guest ended before it reported ready",
                _ => "the guest ended",
            };
            self.fail_guest(id, g, why);
            return;
        }
        vm::trim_logs(&g.files());
        let events = g.events();
        let now = vm::now_ms();
        let started = g.agent_started_ms.or_else(|| {
            events
                .iter()
                .any(|e| matches!(e, Event::Started(_)))
                .then_some(now)
        });
        // The last word on readiness counts (a step may regress after `ready`).
        let ready = events
            .iter()
            .rev()
            .find_map(|e| match e {
                Event::Ready => Some(true),
                Event::NotReady(_) => Some(false),
                Event::Started(_) => None,
            })
            .unwrap_or(false);
        let ready_ms = g.ready_ms.or_else(|| ready.then_some(now));
        if started != g.agent_started_ms || ready_ms != g.ready_ms {
            if started.is_some() && g.agent_started_ms.is_none() {
                info!(lease = %id, after_ms = now - g.vmm_started_ms, "local provider: the guest's agent started");
            }
            self.inner.ledger.update(id, |x| {
                if let Some(r) = x.guest.as_mut() {
                    r.agent_started_ms = started;
                    r.ready_ms = ready_ms;
                }
            });
        }
        if e.lease.state == LeaseState::Booting && ready {
            info!(lease = %id, after_ms = now - g.vmm_started_ms, "local provider: guest ready, lease running");
            self.inner
                .ledger
                .update(id, |x| set_state(&mut x.lease, LeaseState::Running, None));
        } else if e.lease.state == LeaseState::Booting {
            let timeout = self.vm_settings().boot_timeout;
            if now.saturating_sub(g.vmm_started_ms) > timeout.as_millis() as u64 {
                let why = format!(
                    "the guest did not report ready within {} s ({})",
                    timeout.as_secs(),
                    g.accel.as_str()
                );
                // Failed at once (the monitor looks no more), then powered off.
                self.fail_guest(id, g, &why);
                let g = g.clone();
                tokio::task::spawn_blocking(move || g.stop());
            }
        }
    }

    /// Powers a lease's guest off and removes its jail and disks.
    pub(crate) fn remove_guest(&self, e: &LeaseEntry, g: &GuestRecord) {
        g.stop();
        self.jail_of(e).remove();
        let _ = std::fs::remove_dir_all(&g.dir);
    }
}
