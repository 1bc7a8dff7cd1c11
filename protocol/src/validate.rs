//! Validation of what peers send, before anything touches the model.
//!
//! Every rejection has a typed [`RejectReason`]: the shell counts it in a
//! metric, logs it, lowers the sender's score, and nothing is applied.

use std::collections::{BTreeSet, VecDeque};

use crate::{
    codec::Payload,
    identity::Signed,
    ids::{Hash32, NodeId, RunId},
    wire::UpdateAnnouncement,
};

pub use crate::reject::RejectReason;

/// The poisoning guard: an update whose norm (per step, see
/// [`UpdateValidator::check_payload`]) exceeds `factor` times the median of
/// recently accepted ones is rejected. The window is bounded.
#[derive(Clone, Debug)]
pub struct NormGuard {
    window: VecDeque<f64>,
    capacity: usize,
    factor: f64,
    min_samples: usize,
}

impl NormGuard {
    /// A guard over the last `capacity` accepted norms, enforcing once
    /// `min_samples` were seen.
    pub fn new(capacity: usize, factor: f64, min_samples: usize) -> Self {
        Self { window: VecDeque::with_capacity(capacity), capacity: capacity.max(1), factor, min_samples }
    }

    /// The running median, if any norms were recorded.
    pub fn median(&self) -> Option<f64> {
        median_of(self.window.iter().copied())
    }

    /// Checks a norm against the bound.
    pub fn check(&self, norm: f64) -> Result<(), RejectReason> {
        if self.window.len() < self.min_samples {
            return Ok(());
        }
        match self.median() {
            Some(m) if norm > self.factor * m.max(f64::MIN_POSITIVE) => Err(RejectReason::NormTooLarge),
            _ => Ok(()),
        }
    }

    /// Records an accepted norm.
    pub fn record(&mut self, norm: f64) {
        if self.window.len() == self.capacity {
            self.window.pop_front();
        }
        self.window.push_back(norm);
    }
}

/// The upper median of `values` (`None` for none).
pub(crate) fn median_of(values: impl Iterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

/// Checks announcements and payloads of one run.
#[derive(Clone, Debug)]
pub struct UpdateValidator {
    run_id: RunId,
    num_values: u64,
    allow: Option<BTreeSet<NodeId>>,
    max_steps: u32,
    norms: NormGuard,
}

/// Default: median of the last 64 accepted norms, bound 10x, after 4.
const NORM_WINDOW: usize = 64;
const NORM_FACTOR: f64 = 10.0;
const NORM_MIN_SAMPLES: usize = 4;

impl UpdateValidator {
    /// A validator for `run_id` with models of `num_values` parameters
    /// and rounds of up to `max_steps` (the run's H) inner steps; `allow`
    /// restricts sources (private swarms).
    pub fn new(run_id: RunId, num_values: u64, max_steps: u32, allow: Option<BTreeSet<NodeId>>) -> Self {
        let norms = NormGuard::new(NORM_WINDOW, NORM_FACTOR, NORM_MIN_SAMPLES);
        Self { run_id, num_values, allow, max_steps: max_steps.max(1), norms }
    }

    /// Opens a signed announcement and checks signature, run, source and shape.
    pub fn check_announcement(&self, signed: &Signed<UpdateAnnouncement>) -> Result<UpdateAnnouncement, RejectReason> {
        let ann = signed.decode_unverified().map_err(|_| RejectReason::Malformed)?;
        crate::identity::verify(
            &ann.id.src,
            <UpdateAnnouncement as crate::identity::Signable>::DOMAIN,
            signed.body(),
            signed.signature(),
        )
        .map_err(|_| RejectReason::BadSignature)?;
        if ann.run_id != self.run_id {
            return Err(RejectReason::WrongRun);
        }
        if let Some(allow) = &self.allow
            && !allow.contains(&ann.id.src)
        {
            return Err(RejectReason::NotAllowed);
        }
        if ann.num_values != self.num_values || ann.codec.validate().is_err() {
            return Err(RejectReason::ShapeMismatch);
        }
        if ann.payload_len > ann.codec.max_encoded_len(self.num_values as usize) as u64 {
            return Err(RejectReason::TooLarge);
        }
        if !ann.speed.is_finite() || ann.speed < 0.0 || !ann.loss.is_finite() {
            return Err(RejectReason::NonFinite);
        }
        Ok(ann)
    }

    /// Checks a fetched payload against its announcement: size, hash,
    /// structure, finite values and the norm bound. Returns the norm per
    /// step that the guard compared, to record if the update is accepted.
    ///
    /// Rounds differ in length by design (work proportional to speed, a
    /// tick joined late), and a pseudo-gradient's norm grows with its
    /// steps. Compared whole, once the first accepted rounds were short,
    /// full rounds could be rejected; a rejected norm is never recorded, so
    /// the median would never recover. So the guard compares norm per step.
    /// The claimed steps count between 1 and the run's H: claiming more
    /// than H steps buys a sender no room.
    pub fn check_payload(&self, ann: &UpdateAnnouncement, bytes: &[u8]) -> Result<f64, RejectReason> {
        if bytes.len() as u64 != ann.payload_len {
            return Err(RejectReason::TooLarge);
        }
        if Hash32::of(bytes) != ann.payload_hash {
            return Err(RejectReason::HashMismatch);
        }
        let payload =
            Payload::parse(ann.codec, self.num_values as usize, bytes).map_err(|_| RejectReason::ShapeMismatch)?;
        let (finite, norm_sq) = payload.finite_and_norm_sq();
        if !finite {
            return Err(RejectReason::NonFinite);
        }
        let per_step = norm_sq.sqrt() / ann.steps.clamp(1, self.max_steps) as f64;
        self.norms.check(per_step)?;
        Ok(per_step)
    }

    /// Records the norm per step of an update that was accepted.
    pub fn record_accepted_norm(&mut self, norm: f64) {
        self.norms.record(norm);
    }

    /// The allowlist check alone (connections, receipts, heartbeats).
    pub fn is_allowed(&self, node: &NodeId) -> bool {
        self.allow.as_ref().is_none_or(|a| a.contains(node))
    }

    /// The run this validator accepts.
    pub fn run_id(&self) -> RunId {
        self.run_id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        codec::{CodecKind, encode},
        identity::Keypair,
        ids::UpdateId,
    };

    fn make(k: &Keypair, run: RunId, values: &[f32]) -> (Signed<UpdateAnnouncement>, Vec<u8>) {
        make_with_steps(k, run, values, 1)
    }

    fn make_with_steps(k: &Keypair, run: RunId, values: &[f32], steps: u32) -> (Signed<UpdateAnnouncement>, Vec<u8>) {
        let mut bytes = Vec::new();
        encode(CodecKind::F32, values, &mut bytes);
        let ann = UpdateAnnouncement {
            run_id: run,
            id: UpdateId { src: k.node_id(), round: 0 },
            base_total: 0,
            base: None,
            base_tick: 0,
            publish_tick: 0,
            sender_staleness: 0,
            steps,
            samples: 1,
            speed: 1.0,
            loss: 1.0,
            codec: CodecKind::F32,
            num_values: values.len() as u64,
            payload_len: bytes.len() as u64,
            payload_hash: Hash32::of(&bytes),
        };
        (Signed::sign(&ann, k), bytes)
    }

    #[test]
    fn each_bad_input_gets_its_reason() {
        let run = RunId(Hash32([1; 32]));
        let k = Keypair::deterministic(4, 0);
        let mut v = UpdateValidator::new(run, 4, 50, None);
        let (good, bytes) = make(&k, run, &[0.1, 0.2, 0.3, 0.4]);
        let ann = v.check_announcement(&good).unwrap();
        let norm = v.check_payload(&ann, &bytes).unwrap();
        for _ in 0..4 {
            v.record_accepted_norm(norm);
        }

        let (wrong_run, _) = make(&k, RunId(Hash32([2; 32])), &[0.0; 4]);
        assert_eq!(v.check_announcement(&wrong_run), Err(RejectReason::WrongRun));
        let (wrong_shape, _) = make(&k, run, &[0.0; 5]);
        assert_eq!(v.check_announcement(&wrong_shape), Err(RejectReason::ShapeMismatch));
        let forged = good.clone().with_signature([7; 64]);
        assert_eq!(v.check_announcement(&forged), Err(RejectReason::BadSignature));

        let (nan, nan_bytes) = make(&k, run, &[0.1, f32::NAN, 0.3, 0.4]);
        let nan_ann = v.check_announcement(&nan).unwrap();
        assert_eq!(v.check_payload(&nan_ann, &nan_bytes), Err(RejectReason::NonFinite));

        let (big, big_bytes) = make(&k, run, &[10.0, 20.0, 30.0, 40.0]);
        let big_ann = v.check_announcement(&big).unwrap();
        assert_eq!(v.check_payload(&big_ann, &big_bytes), Err(RejectReason::NormTooLarge));

        let mut tampered = bytes.clone();
        tampered[0] ^= 1;
        assert_eq!(v.check_payload(&ann, &tampered), Err(RejectReason::HashMismatch));
        assert_eq!(v.check_payload(&ann, &bytes[..8]), Err(RejectReason::TooLarge));

        let other = Keypair::deterministic(4, 1);
        let private = UpdateValidator::new(run, 4, 50, Some([other.node_id()].into_iter().collect()));
        assert_eq!(private.check_announcement(&good), Err(RejectReason::NotAllowed));
    }

    #[test]
    fn short_first_rounds_do_not_shut_out_full_rounds() {
        let run = RunId(Hash32([1; 32]));
        let k = Keypair::deterministic(4, 0);
        let mut v = UpdateValidator::new(run, 4, 500, None);
        let base = [0.1, 0.2, 0.3, 0.4];
        let scaled = |f: f32| base.map(|x| x * f);
        let check = |v: &UpdateValidator, values: &[f32], steps: u32| {
            let (signed, bytes) = make_with_steps(&k, run, values, steps);
            v.check_payload(&v.check_announcement(&signed).unwrap(), &bytes)
        };
        // The first accepted rounds were cut short: 10 steps each.
        for _ in 0..4 {
            let per_step = check(&v, &base, 10).unwrap();
            v.record_accepted_norm(per_step);
        }
        // A full round of 300 steps moves 30 times as far: honest, accepted.
        assert!(check(&v, &scaled(30.0), 300).is_ok());
        // The same displacement claimed as one step is 300x per step.
        assert_eq!(check(&v, &scaled(30.0), 1), Err(RejectReason::NormTooLarge));
        // Claiming more steps than H (500) counts as H: 10,000 times the
        // displacement over "100,000 steps" is 200x per step.
        assert_eq!(check(&v, &scaled(10_000.0), 100_000), Err(RejectReason::NormTooLarge));
    }

    #[test]
    fn norm_guard_uses_the_running_median() {
        let mut g = NormGuard::new(5, 10.0, 3);
        assert!(g.check(1e9).is_ok(), "not enforced before min_samples");
        for n in [1.0, 2.0, 3.0] {
            g.record(n);
        }
        assert_eq!(g.median(), Some(2.0));
        assert!(g.check(19.0).is_ok());
        assert_eq!(g.check(21.0), Err(RejectReason::NormTooLarge));
        for _ in 0..10 {
            g.record(100.0);
        }
        assert_eq!(g.median(), Some(100.0), "window is bounded");
    }
}
