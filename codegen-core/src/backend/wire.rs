//! What the backends' wire types share.

use serde::Deserialize;

/// Deserialises a list that a server may send as `null` or leave out.
pub(crate) fn null_as_empty<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(deserializer)?.unwrap_or_default())
}

/// Mints ids for tool calls that arrived without one, unique within one backend's life.
#[derive(Debug, Default)]
pub(crate) struct IdMinter {
    next: u64,
}

impl IdMinter {
    /// The id a server (or script) gave a call, or a new one when it gave none or an empty one.
    pub fn keep_or_mint(&mut self, id: Option<String>) -> String {
        match id {
            Some(id) if !id.is_empty() => id,
            _ => {
                self.next += 1;
                format!("call_pg{}", self.next)
            }
        }
    }
}
