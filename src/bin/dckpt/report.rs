//! Reports as JSON: every command that reports takes `--json` and gives
//! one object, its fields beside `schema` (the version of these documents,
//! [`SCHEMA`]) and `command`: the store commands and `config` print it on
//! standard output, the benchmarks write it to the file `--json` names
//! (`bench-collective` prints it from rank 0).

use dckpt::error::{Error, Result};
use serde::Serialize;

/// The version of the JSON reports: raised when a field changes meaning or
/// goes away (new fields do not raise it).
pub const SCHEMA: u32 = 1;

/// `report` of `command` as one JSON value: its fields (or, for a report
/// that is no object, `report`: a list of rows, say) beside `schema` and
/// `command`.
pub fn value(command: &str, report: &impl Serialize) -> Result<serde_json::Value> {
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
    Ok(serde_json::Value::Object(doc))
}

/// [`value`] as indented text.
pub fn document(command: &str, report: &impl Serialize) -> Result<String> {
    serde_json::to_string_pretty(&value(command, report)?)
        .map_err(|e| Error::Internal(format!("the {command} report as JSON: {e}")))
}

/// Prints `report` of `command` on standard output ([`document`]).
pub fn print_json(command: &str, report: &impl Serialize) -> Result<()> {
    println!("{}", document(command, report)?);
    Ok(())
}

/// Prints `report` of `command` on standard output as one line ([`document`],
/// compact): what scripts that read one line per run take.
pub fn print_json_line(command: &str, report: &impl Serialize) -> Result<()> {
    println!("{}", value(command, report)?);
    Ok(())
}

/// Writes `report` of `command` to `path` ([`document`]).
pub fn write_json(path: &std::path::Path, command: &str, report: &impl Serialize) -> Result<()> {
    std::fs::write(path, document(command, report)? + "\n").map_err(|e| Error::io(path, e))
}
