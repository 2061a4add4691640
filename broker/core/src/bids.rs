//! Which bids to take, and when to stop waiting for more.

use std::time::Duration;

use socialweb_market::Bid;

/// Bids, best first: cheapest, then soonest, then by id (a stable order).
pub fn choose(mut bids: Vec<Bid>) -> Vec<Bid> {
    bids.sort_by(|a, b| {
        (a.price_micros_per_hour, a.eta_ms, &a.id).cmp(&(b.price_micros_per_hour, b.eta_ms, &b.id))
    });
    bids
}

/// How long bids are waited for on an RFP, and how often it is read meanwhile (a provision's
/// limits say).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Take what there is at this deadline.
    pub deadline: Duration,
    /// Take the bids once none new came for this long.
    pub settle: Duration,
    /// Read the RFP this often.
    pub poll: Duration,
}

/// Whether to go on waiting for bids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Look again after this long.
    More(Duration),
    /// Take what there is (possibly nothing).
    Done,
}

/// With `seen` bids after `waited`, the last new one `quiet` ago: done at the deadline, or
/// once some came and none new for the settle time; else look again (never past the
/// deadline).
pub fn wait(seen: usize, waited: Duration, quiet: Duration, w: &Window) -> Wait {
    if waited >= w.deadline || (seen > 0 && quiet >= w.settle) {
        return Wait::Done;
    }
    Wait::More(w.poll.min(w.deadline - waited))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bid(id: &str, price: u64, eta: u64) -> Bid {
        Bid {
            id: id.into(),
            rfp_id: "r".into(),
            provider: "p".into(),
            price_micros_per_hour: price,
            eta_ms: eta,
            expires_at: String::new(),
            machine: None,
        }
    }

    #[test]
    fn cheapest_then_soonest() {
        let got: Vec<String> = choose(vec![bid("a", 5, 1), bid("b", 3, 9), bid("c", 3, 2)])
            .into_iter()
            .map(|b| b.id)
            .collect();
        assert_eq!(got, ["c", "b", "a"]);
    }

    #[test]
    fn waiting_ends_at_the_deadline_or_once_bids_settle() {
        let ms = Duration::from_millis;
        let l = Window {
            deadline: ms(2000),
            settle: ms(300),
            poll: ms(100),
        };
        assert_eq!(wait(0, ms(500), ms(500), &l), Wait::More(ms(100)));
        assert_eq!(wait(1, ms(500), ms(299), &l), Wait::More(ms(100)));
        assert_eq!(wait(1, ms(500), ms(300), &l), Wait::Done);
        assert_eq!(
            wait(0, ms(1950), ms(1950), &l),
            Wait::More(ms(50)),
            "never past the deadline"
        );
        assert_eq!(wait(0, ms(2000), ms(2000), &l), Wait::Done);
    }
}
