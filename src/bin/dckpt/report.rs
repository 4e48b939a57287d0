//! Reports as JSON: every command that reports takes `--json` and prints
//! one object on standard output, its fields beside `schema` (the version
//! of these documents, [`SCHEMA`]) and `command`.

use dckpt::error::{Error, Result};
use serde::Serialize;

/// The version of the JSON reports: raised when a field changes meaning or
/// goes away (new fields do not raise it).
pub const SCHEMA: u32 = 1;

/// Prints `report` of `command` as one JSON object: its fields (or, for a
/// report that is no object, `report`) beside `schema` and `command`.
pub fn print_json(command: &str, report: &impl Serialize) -> Result<()> {
    let value =
        serde_json::to_value(report).map_err(|e| Error::Internal(format!("the {command} report as JSON: {e}")))?;
    let mut doc = serde_json::Map::new();
    doc.insert("schema".into(), SCHEMA.into());
    doc.insert("command".into(), command.into());
    match value {
        serde_json::Value::Object(fields) => doc.extend(fields),
        other => {
            doc.insert("report".into(), other);
        }
    }
    let text = serde_json::to_string_pretty(&serde_json::Value::Object(doc))
        .map_err(|e| Error::Internal(format!("the {command} report as JSON: {e}")))?;
    println!("{text}");
    Ok(())
}
