//! Durations as the configuration writes them: text such as `90s`, `2m` or `1h30m`, in the
//! file, in the variables and in the schema. Every section with a duration uses both.

use schemars::JsonSchema;

/// A duration as humans write it (`90s`, `2m`, `1h30m`): the schema of every duration here,
/// which the file and the variables give as text (`humantime`).
pub(super) struct HumanDuration;

impl JsonSchema for HumanDuration {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({"type": "string", "format": "humantime"})
    }
}

/// Durations as humans write them (`2m`, `90s`, `1m30s`), in the file and in variables.
pub(super) mod humantime_serde_compat {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s).map_err(|e| serde::de::Error::custom(format!("{s:?}: {e}")))
    }
}

/// Long durations, written in whole days where they are (`3650d`, not humantime's
/// `9years 11months 30days 3h 36m`); read as any other duration.
pub(super) mod days_compat {
    use std::time::Duration;

    use serde::{Deserializer, Serializer};

    const DAY: u64 = 24 * 3600;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        let secs = d.as_secs();
        if secs >= DAY && secs.is_multiple_of(DAY) && d.subsec_nanos() == 0 {
            s.serialize_str(&format!("{}d", secs / DAY))
        } else {
            super::humantime_serde_compat::serialize(d, s)
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        super::humantime_serde_compat::deserialize(d)
    }
}
