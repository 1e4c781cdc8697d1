//! A step's fingerprint: everything that can change its result, hashed into its key.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use codegen_core::fs;

use crate::config::{Chain, CheckSpec, StepConfig};
use crate::error::Error;
use crate::hash::sha256_hex;
use crate::record::lock::{Fingerprint, LockedStep};

/// What [`plan`](super::assess::plan) works out once for all its steps: the hashes of files that several steps
/// read (a shared system prompt, an input folder) and of the tool contracts.
#[derive(Default)]
pub(super) struct Memo {
    /// Hashes of the files fingerprints read, by path.
    file_hashes: HashMap<PathBuf, String>,
    /// Contract hashes, by protocol and whether there is a check.
    contracts: HashMap<(&'static str, bool), String>,
}

impl Memo {
    pub(super) fn hash_file(&mut self, path: &Path) -> Result<String, Error> {
        if let Some(hash) = self.file_hashes.get(path) {
            return Ok(hash.clone());
        }
        let hash = sha256_hex(&fs::read(path)?);
        self.file_hashes.insert(path.to_path_buf(), hash.clone());
        Ok(hash)
    }
}

/// What a fingerprint holds of the steps its step runs after.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Handoff {
    /// [`Fingerprint::previous`].
    pub previous: Option<String>,
    /// [`Fingerprint::after`].
    pub after: BTreeMap<String, String>,
}

/// What `step`'s fingerprint holds of `recorded`, the records of the steps it runs after
/// (each [`StepConfig::after`], in that order): the digest of the one step in `previous` when
/// it runs after exactly the step before it in id order, as every step did before `after`
/// existed, so those keys do not change; else one digest per step, by id, in `after`.
pub fn handoff(chain: &Chain, step: &StepConfig, recorded: &[&LockedStep]) -> Handoff {
    let before = chain.index(&step.id).and_then(|i| i.checked_sub(1)).map(|i| chain.steps[i].id.as_str());
    match recorded {
        [] => Handoff::default(),
        [only] if Some(only.id.as_str()) == before => {
            Handoff { previous: Some(only.handoff_digest()), after: BTreeMap::new() }
        }
        many => Handoff {
            previous: None,
            after: many.iter().map(|entry| (entry.id.clone(), entry.handoff_digest())).collect(),
        },
    }
}

/// The fingerprint of `step` as it is declared now, given the records of the steps it runs
/// after (each of [`StepConfig::after`], in that order).
pub fn fingerprint(chain: &Chain, step: &StepConfig, after: &[&LockedStep]) -> Result<Fingerprint, Error> {
    fingerprint_with(chain, step, handoff(chain, step, after), &mut Memo::default())
}

pub(super) fn fingerprint_with(
    chain: &Chain,
    step: &StepConfig,
    handoff: Handoff,
    memo: &mut Memo,
) -> Result<Fingerprint, Error> {
    let mut inputs = BTreeMap::new();
    for input in &step.inputs {
        if input.is_dir {
            // What the sandbox shows the model: links followed inside the package only.
            let files = codegen_core::sandbox::input_files(&input.real_path, Some(&chain.package_dir))
                .map_err(|source| Error::Sandbox { id: step.id.clone(), source })?;
            for (rel, real) in files {
                let virtual_path = format!("{}/{rel}", input.virtual_path);
                if !codegen_core::sandbox::is_protected(&virtual_path) {
                    inputs.insert(virtual_path, memo.hash_file(&real)?);
                }
            }
        } else {
            inputs.insert(input.virtual_path.clone(), memo.hash_file(&input.real_path)?);
        }
    }
    let with_check = step.check != CheckSpec::None;
    let contract = memo
        .contracts
        .entry((step.protocol.as_str(), with_check))
        .or_insert_with(|| contract_hash(step.protocol, with_check))
        .clone();
    Ok(Fingerprint {
        backend: step.backend.kind.as_str().to_string(),
        model: step.model.clone(),
        protocol: step.protocol.as_str().to_string(),
        seed: step.seed,
        temperature: step.temperature,
        prompt: memo.hash_file(&step.prompt)?,
        system_prompt: step.system_prompt.as_deref().map(|path| memo.hash_file(path)).transpose()?,
        contract,
        check: match &step.check {
            CheckSpec::None => None,
            // The edition decides what compiles, so it is part of what the check is.
            CheckSpec::Rustc => Some(format!("rustc --edition={}", chain.edition)),
            command => Some(command.describe()),
        },
        script: match (&step.backend.script, step.backend.kind) {
            (Some(script), codegen_core::backend::BackendKind::Scripted) => Some(memo.hash_file(script)?),
            _ => None,
        },
        constrain: step.constrained().then(|| codegen_core::Constrain::Auto.as_str().to_string()),
        outputs: step.outputs.clone(),
        inputs,
        previous: handoff.previous,
        after: handoff.after,
    })
}

/// The hash of what the loop tells a model under `protocol`, with or without a check.
pub(super) fn contract_hash(protocol: codegen_core::ToolProtocol, with_check: bool) -> String {
    sha256_hex(codegen_core::__private::run::contract(protocol, with_check).as_bytes())
}

/// The protocol a fingerprint names.
pub(super) fn protocol_named(name: &str) -> Option<codegen_core::ToolProtocol> {
    codegen_core::ToolProtocol::ALL.into_iter().find(|p| p.as_str() == name)
}
