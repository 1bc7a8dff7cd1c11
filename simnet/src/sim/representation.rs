//! The representation measurement of question 2 of the study: how alike a
//! round's local model and the anchor it started from compute on a fixed
//! held-out probe (linear CKA per hidden layer), once per group per window.

use super::{Sim, SimError};

pub use ragtag_models::update_trace::PROBE_ROWS;

impl Sim<'_> {
    /// Measures node group `group`'s round that ended at `local`, whose
    /// update was `delta` (anchor minus local, so the anchor is their sum).
    pub(super) fn record_representation(&mut self, group: usize, local: &[f32], delta: &[f32]) -> Result<(), SimError> {
        let anchor: Vec<f32> = local.iter().zip(delta).map(|(l, d)| l + d).collect();
        let similarity =
            self.evaluator.representation_similarity(local, &anchor, &self.probe).map_err(SimError::Evaluate)?;
        self.layers.record_representation(group, similarity);
        Ok(())
    }
}
