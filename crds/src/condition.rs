//! The `Ready` condition every custom resource carries (metav1.Condition shape).
//!
//! Reconcilers compute a new condition each pass; [`set_condition`] keeps
//! `lastTransitionTime` unchanged unless the status really flips, so that a no-op
//! reconcile writes an identical status and the API server emits no watch event.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Type of the condition `kubectl wait --for=condition=Ready` waits for.
pub const READY: &str = "Ready";

/// The three values of `Condition.status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConditionStatus {
    /// The condition holds (`"True"`).
    True,
    /// The condition does not hold (`"False"`).
    False,
    /// Not known yet, e.g. before the first reconcile has an answer (`"Unknown"`).
    Unknown,
}

impl ConditionStatus {
    /// The string Kubernetes expects in `status`.
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
            ConditionStatus::Unknown => "Unknown",
        }
    }
}

/// Inserts or replaces the condition of `type_` in `conditions`.
///
/// `lastTransitionTime` moves to `now` only when the status changes; reason,
/// message and observedGeneration are always updated.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: ConditionStatus,
    reason: &str,
    message: &str,
    observed_generation: Option<i64>,
    now: Time,
) {
    let status = status.as_str();
    if let Some(existing) = conditions.iter_mut().find(|c| c.type_ == type_) {
        if existing.status != status {
            existing.last_transition_time = now;
            existing.status = status.to_owned();
        }
        existing.reason = reason.to_owned();
        existing.message = message.to_owned();
        existing.observed_generation = observed_generation;
        return;
    }
    conditions.push(Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
        observed_generation,
        last_transition_time: now,
    });
}

/// Whether `conditions` hold `Ready=True`.
pub fn is_ready(conditions: &[Condition]) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == READY && c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn transition_time_moves_only_when_status_flips() {
        let mut conds = Vec::new();
        set_condition(
            &mut conds,
            READY,
            ConditionStatus::False,
            "Pending",
            "waiting",
            Some(1),
            at(10),
        );
        assert!(!is_ready(&conds));
        set_condition(
            &mut conds,
            READY,
            ConditionStatus::False,
            "StillPending",
            "still",
            Some(2),
            at(20),
        );
        assert_eq!(conds.len(), 1);
        assert_eq!(conds[0].last_transition_time, at(10));
        assert_eq!(conds[0].reason, "StillPending");
        assert_eq!(conds[0].observed_generation, Some(2));
        set_condition(
            &mut conds,
            READY,
            ConditionStatus::True,
            "Published",
            "ok",
            Some(2),
            at(30),
        );
        assert_eq!(conds[0].last_transition_time, at(30));
        assert!(is_ready(&conds));
    }
}
