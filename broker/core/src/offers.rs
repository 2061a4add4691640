//! The providers' offers as the scale decision rents from them: each shape where it is
//! offered (a region and zone, from the offer) at the lowest price any provider there asks,
//! and which providers an RFP for a node of one topology goes to.

use socialweb_market::{Offer, Topology};

use crate::scale::Rentable;

/// Where a provider's nodes run: each part the operator pinned (`market.providers[].region`,
/// `.zone`), else what its offer says (a provider's word is taken only where the operator
/// has none).
pub fn pinned(offer: &Topology, operator: &Topology) -> Topology {
    Topology {
        region: operator.region.clone().or_else(|| offer.region.clone()),
        zone: operator.zone.clone().or_else(|| offer.zone.clone()),
    }
}

/// Every shape of `offers` in each topology it is offered in, at its lowest price there;
/// in the order first offered.
pub fn rentables(offers: &[(String, Offer)]) -> Vec<Rentable> {
    let mut out: Vec<Rentable> = Vec::new();
    for (_, o) in offers {
        for s in &o.shapes {
            match out
                .iter_mut()
                .find(|r| r.shape.spec == s.spec && r.topology == o.topology)
            {
                Some(r) => {
                    r.shape.price_micros_per_hour =
                        r.shape.price_micros_per_hour.min(s.price_micros_per_hour)
                }
                None => out.push(Rentable {
                    shape: *s,
                    topology: o.topology.clone(),
                    allocatable: None,
                }),
            }
        }
    }
    out
}

/// The providers (by the broker's names) whose offer is in `topology`: where an RFP for a
/// node planned there goes. `None` (every provider) for a node planned with no region or
/// zone, so that a plan made before the providers named theirs still rents.
pub fn providers_in(offers: &[(String, Offer)], topology: &Topology) -> Option<Vec<String>> {
    (!topology.is_empty()).then(|| {
        offers
            .iter()
            .filter(|(_, o)| &o.topology == topology)
            .map(|(n, _)| n.clone())
            .collect()
    })
}

/// Why a node rented as `r` (its shape where it was offered, with what the plan counted it
/// at) is not what was paid for, if it is not: its Node's `capacity` (CPU millis, memory
/// bytes) is less than the plan counted on, the RFP's shape (memory less
/// [`crate::scale::MEMORY_RESERVE_PERCENT`]: a guest's kernel keeps some) until a node of it has said
/// what it gives. Once one has, nodes that give as much pass: the plan counts them at it.
pub fn short(r: &Rentable, capacity: (u64, u64)) -> Option<String> {
    let (cpu, mem) = r.counted_at();
    (capacity.0 < cpu || capacity.1 < mem).then(|| {
        format!(
            "its Node reports {}m CPU and {} MiB of memory, less than the {}m and {} MiB a \
             node of shape {} was counted at (the RFP asked {} vCPUs and {} MiB)",
            capacity.0,
            capacity.1 >> 20,
            cpu,
            mem >> 20,
            r.shape.spec.instance_type(),
            r.shape.spec.vcpu,
            r.shape.spec.mem_mib
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use socialweb_market::{Isolation, NodeSpec, Shape};

    fn offer(zone: Option<&str>, prices: &[(u32, u64)]) -> Offer {
        Offer {
            provider: "p".into(),
            isolation: Isolation::Namespace,
            machine: None,
            shapes: prices
                .iter()
                .map(|&(vcpu, price)| Shape {
                    spec: NodeSpec {
                        vcpu,
                        mem_mib: 2048,
                        disk_mib: 10240,
                    },
                    price_micros_per_hour: price,
                })
                .collect(),
            free: 4,
            topology: Topology {
                region: zone.map(|_| "eu".into()),
                zone: zone.map(Into::into),
            },
        }
    }

    #[test]
    fn a_shape_is_rentable_once_per_topology_at_its_lowest_price_there() {
        let offers = vec![
            ("a1".to_string(), offer(Some("a"), &[(1, 30), (2, 50)])),
            ("a2".to_string(), offer(Some("a"), &[(1, 20)])),
            ("b".to_string(), offer(Some("b"), &[(1, 10)])),
            ("x".to_string(), offer(None, &[(1, 5)])),
        ];
        let r = rentables(&offers);
        let got: Vec<(u32, Option<&str>, u64)> = r
            .iter()
            .map(|r| {
                (
                    r.shape.spec.vcpu,
                    r.topology.zone.as_deref(),
                    r.shape.price_micros_per_hour,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (1, Some("a"), 20),
                (2, Some("a"), 50),
                (1, Some("b"), 10),
                (1, None, 5)
            ]
        );
        assert_eq!(
            providers_in(&offers, &r[0].topology),
            Some(vec!["a1".to_string(), "a2".to_string()])
        );
        assert_eq!(providers_in(&offers, &Topology::default()), None);
    }

    #[test]
    fn the_operators_word_on_a_zone_stands_for_the_providers() {
        let t = |r: Option<&str>, z: Option<&str>| Topology {
            region: r.map(Into::into),
            zone: z.map(Into::into),
        };
        let offer = t(Some("eu"), Some("eu-1a"));
        assert_eq!(pinned(&offer, &Topology::default()), offer);
        assert_eq!(
            pinned(&offer, &t(None, Some("eu-1b"))),
            t(Some("eu"), Some("eu-1b"))
        );
        assert_eq!(
            pinned(&Topology::default(), &t(Some("us"), None)),
            t(Some("us"), None)
        );
    }

    #[test]
    fn a_node_short_of_its_shape_is_told_until_the_plan_counts_it_as_it_is() {
        let mut r = rentables(&[("p".to_string(), offer(None, &[(4, 10)]))]).remove(0);
        // 4 vCPUs and 2 GiB asked: 4000m and 1843 MiB counted on.
        assert_eq!(short(&r, (4000, 2048 << 20)), None);
        assert_eq!(
            short(&r, (4000, 1900 << 20)),
            None,
            "a guest's kernel keeps some"
        );
        let why = short(&r, (2000, 24 << 30)).expect("2 CPUs of 4");
        assert!(why.contains("2000m CPU"), "{why}");
        assert!(why.contains("4 vCPUs"), "{why}");
        // Once the plan counts the shape at what its nodes gave, such a node passes.
        r.allocatable = Some((2000, 2 << 30));
        assert_eq!(short(&r, (2000, 24 << 30)), None);
        assert!(short(&r, (1000, 24 << 30)).is_some());
    }
}
