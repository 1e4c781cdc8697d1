//! Why a step is stale, in words: what differs between its recorded fingerprint and today's.

use crate::config::{Chain, StepConfig};
use crate::record::lock::Fingerprint;

use super::fingerprint::{contract_hash, protocol_named};

/// What differs between a recorded fingerprint and the current one, in words.
pub fn explain(step: &StepConfig, recorded: &Fingerprint, now: &Fingerprint) -> Vec<String> {
    let mut reasons = Vec::new();
    if recorded.model != now.model {
        reasons.push(format!("model changed: `{}` -> {}", recorded.model, step.describe_model()));
    }
    let mut setting = |name: &str, before: String, after: String| {
        if before != after {
            reasons.push(format!("{name} changed: {before} -> {after}"));
        }
    };
    let show = |v: Option<String>| v.unwrap_or_else(|| "(none)".into());
    setting("backend", recorded.backend.clone(), now.backend.clone());
    setting("protocol", recorded.protocol.clone(), now.protocol.clone());
    setting("seed", show(recorded.seed.map(|s| s.to_string())), show(now.seed.map(|s| s.to_string())));
    setting(
        "temperature",
        show(recorded.temperature.map(|t| t.to_string())),
        show(now.temperature.map(|t| t.to_string())),
    );
    setting("declared outputs", format!("{:?}", recorded.outputs), format!("{:?}", now.outputs));
    if recorded.prompt != now.prompt {
        reasons.push(format!("prompt `{}` changed", step.prompt_display));
    }
    match (&recorded.system_prompt, &now.system_prompt) {
        (a, b) if a == b => {}
        (None, Some(_)) => reasons.push("a system prompt was added".into()),
        (Some(_), None) => reasons.push("the system prompt was removed".into()),
        _ => reasons.push("the system prompt changed".into()),
    }
    // The contract follows from the protocol and whether there is a check; blame codegen-core
    // only when the recorded settings would give another contract today.
    let contract_today = protocol_named(&recorded.protocol).map(|p| contract_hash(p, recorded.check.is_some()));
    if contract_today.as_ref() != Some(&recorded.contract) {
        reasons.push("the tool definitions or the loop's instructions changed (codegen-core was updated)".into());
    }
    if recorded.check != now.check {
        let show = |c: &Option<String>| c.clone().unwrap_or_else(|| "none".into());
        reasons.push(format!("check changed: {} -> {}", show(&recorded.check), show(&now.check)));
    }
    if recorded.constrain != now.constrain {
        reasons.push(match now.constrain {
            Some(_) => "constrained decoding is on now (`constrain = \"off\"` turns it off)".into(),
            None => "constrained decoding is off now".into(),
        });
    }
    if recorded.script != now.script {
        reasons.push("its script changed".into());
    }
    for (path, hash) in &now.inputs {
        match recorded.inputs.get(path) {
            None => reasons.push(format!("input `{path}` was added")),
            Some(old) if old != hash => reasons.push(format!("input `{path}` changed")),
            Some(_) => {}
        }
    }
    for path in recorded.inputs.keys().filter(|p| !now.inputs.contains_key(*p)) {
        reasons.push(format!("input `{path}` was removed"));
    }
    reasons
}

/// What differs in what the steps `step` runs after handed over, between a recorded fingerprint
/// and the current one (whose dependencies all have usable records), in words.
pub fn explain_dependencies(
    chain: &Chain,
    step: &StepConfig,
    recorded: &Fingerprint,
    now: &Fingerprint,
) -> Vec<String> {
    let mut reasons = Vec::new();
    if recorded.previous == now.previous && recorded.after == now.after {
        return reasons;
    }
    let before = chain.index(&step.id).and_then(|i| i.checked_sub(1)).map(|i| chain.steps[i].id.clone());
    // What a fingerprint says the step runs after, for messages.
    let describe = |f: &Fingerprint| match (&f.previous, f.after.is_empty()) {
        (Some(_), _) if f == now => format!("step {} (the step before it)", before.clone().unwrap_or_default()),
        (Some(_), _) => "the step before it".to_string(),
        (None, true) => "no step".to_string(),
        (None, false) => f.after.keys().map(String::as_str).collect::<Vec<_>>().join(", "),
    };
    match (recorded.previous.is_some(), now.previous.is_some()) {
        // The step before it in id order: the message of chains without `after`, as it was.
        (true, true) => reasons.push("the previous step's output changed".into()),
        (false, false) if !recorded.after.is_empty() || !now.after.is_empty() => {
            for (id, digest) in &now.after {
                match recorded.after.get(id) {
                    None => reasons.push(format!("it runs after step {id} now")),
                    Some(old) if old != digest => {
                        reasons.push(format!("the output of step {id}, which it runs after, changed"))
                    }
                    Some(_) => {}
                }
            }
            for id in recorded.after.keys().filter(|id| !now.after.contains_key(*id)) {
                reasons.push(format!("it no longer runs after step {id}"));
            }
        }
        _ => reasons.push(format!("the steps it runs after changed: {} (was: {})", describe(now), describe(recorded))),
    }
    reasons
}

/// `a`, `a and b`, `a, b and c`.
pub(super) fn and_list(items: &[&str]) -> String {
    match items {
        [] => String::new(),
        [one] => (*one).to_string(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}
