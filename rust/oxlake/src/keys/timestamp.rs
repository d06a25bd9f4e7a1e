//! Timestamp-based partition paths, as Apache Hudi's `TimestampBasedAvroKeyGenerator` makes them
//! (docs/KEY_GENERATORS.md): a partition value (a number in the unit of
//! `hoodie.keygen.timebased.timestamp.type`, a date string read with `input.dateformat`, or an
//! Arrow timestamp) is an instant, printed with `output.dateformat` in the output time zone.
//!
//! Where the JVM's default time zone would decide (no zone configured), oxlake takes UTC. Where
//! Java would accept a value and print a partition that says something else (epoch days read as
//! milliseconds, an unknown zone id taken as GMT), oxlake refuses the write, naming the value.

use std::collections::BTreeMap;

use arrow::array::{Array, ArrayRef, AsArray, StringArray};
use arrow::compute::{CastOptions, cast_with_options};
use arrow::datatypes::{DataType, Float64Type, Int64Type, TimeUnit as ArrowUnit};

use super::DEFAULT_PARTITION;
use super::joda::{Pattern, Zone};
use crate::error::{Error, Result};

/// The prefix of the options (`hoodie.keygen.timebased.<suffix>`).
pub const PREFIX: &str = "hoodie.keygen.timebased.";
/// Their former names, which Apache Hudi still reads after the current ones.
const DEPRECATED_PREFIX: &str = "hoodie.deltastreamer.keygen.timebased.";

const TYPE: &str = "timestamp.type";
const SCALAR_UNIT: &str = "timestamp.scalar.time.unit";
const INPUT_FORMAT: &str = "input.dateformat";
const INPUT_DELIMITER: &str = "input.dateformat.list.delimiter.regex";
const INPUT_ZONE: &str = "input.timezone";
const OUTPUT_FORMAT: &str = "output.dateformat";
const OUTPUT_ZONE: &str = "output.timezone";
/// Deprecated: when set, the zone of both input and output.
const ZONE: &str = "timezone";

/// Every option, by its suffix.
pub const OPTIONS: [&str; 8] =
    [TYPE, SCALAR_UNIT, INPUT_FORMAT, INPUT_DELIMITER, INPUT_ZONE, OUTPUT_FORMAT, OUTPUT_ZONE, ZONE];

/// What a partition value holds (`hoodie.keygen.timebased.timestamp.type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimestampType {
    /// Seconds since the epoch.
    UnixTimestamp,
    /// Milliseconds since the epoch.
    EpochMilliseconds,
    /// Microseconds since the epoch.
    EpochMicroseconds,
    /// A number in `timestamp.scalar.time.unit`.
    Scalar,
    /// Text read with `input.dateformat`.
    DateString,
    /// As `DateString` (Apache Hudi gives it no unit for numbers either).
    Mixed,
}

/// `java.util.concurrent.TimeUnit`, as milliseconds per unit (or units per millisecond).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Unit {
    Nanoseconds,
    Microseconds,
    Milliseconds,
    Seconds,
    Minutes,
    Hours,
    Days,
}

impl Unit {
    fn parse(s: &str) -> Option<Unit> {
        Some(match s.to_ascii_uppercase().as_str() {
            "NANOSECONDS" => Unit::Nanoseconds,
            "MICROSECONDS" => Unit::Microseconds,
            "MILLISECONDS" => Unit::Milliseconds,
            "SECONDS" => Unit::Seconds,
            "MINUTES" => Unit::Minutes,
            "HOURS" => Unit::Hours,
            "DAYS" => Unit::Days,
            _ => return None,
        })
    }

    /// `TimeUnit.MILLISECONDS.convert(v, self)`: truncated toward zero, saturated at the ends.
    fn to_millis(self, v: i64) -> i64 {
        match self {
            Unit::Nanoseconds => v / 1_000_000,
            Unit::Microseconds => v / 1_000,
            Unit::Milliseconds => v,
            Unit::Seconds => v.saturating_mul(1_000),
            Unit::Minutes => v.saturating_mul(60_000),
            Unit::Hours => v.saturating_mul(3_600_000),
            Unit::Days => v.saturating_mul(86_400_000),
        }
    }
}

/// How a table's timestamp-based partition fields become path segments.
#[derive(Clone, Debug, PartialEq)]
pub struct TimestampFormat {
    kind: TimestampType,
    /// The unit of numbers; `None` for the text types.
    unit: Option<Unit>,
    inputs: Vec<Pattern>,
    input_zone: Option<Zone>,
    output: Pattern,
    output_zone: Option<Zone>,
}

impl TimestampFormat {
    /// The format the `hoodie.keygen.timebased.*` options describe (the deprecated
    /// `hoodie.deltastreamer.keygen.timebased.*` names too). `Err` names the option at fault.
    pub fn from_options(options: &BTreeMap<String, String>) -> std::result::Result<Self, String> {
        let get = |suffix: &str| {
            [PREFIX, DEPRECATED_PREFIX]
                .iter()
                .find_map(|p| options.get(&format!("{p}{suffix}")))
                .map(|v| v.trim())
                .filter(|v| !v.is_empty())
        };
        let key = |suffix: &str| format!("{PREFIX}{suffix}");
        let kind = match get(TYPE) {
            Some("UNIX_TIMESTAMP") => TimestampType::UnixTimestamp,
            Some("EPOCHMILLISECONDS") => TimestampType::EpochMilliseconds,
            Some("EPOCHMICROSECONDS") => TimestampType::EpochMicroseconds,
            Some("SCALAR") => TimestampType::Scalar,
            Some("DATE_STRING") => TimestampType::DateString,
            Some("MIXED") => TimestampType::Mixed,
            Some(other) => {
                return Err(format!(
                    "`{}` is {other:?}; Apache Hudi knows UNIX_TIMESTAMP, EPOCHMILLISECONDS, EPOCHMICROSECONDS, \
                     SCALAR, DATE_STRING and MIXED (upper case)",
                    key(TYPE)
                ));
            }
            // Apache Hudi 0.14's SQL writer left the type out of some tables' properties while
            // keeping the input format, which only a date string uses.
            None if get(INPUT_FORMAT).is_some() => TimestampType::DateString,
            None => return Err(format!("`{}` is not set", key(TYPE))),
        };
        let unit = match kind {
            TimestampType::UnixTimestamp => Some(Unit::Seconds),
            TimestampType::EpochMilliseconds => Some(Unit::Milliseconds),
            TimestampType::EpochMicroseconds => Some(Unit::Microseconds),
            TimestampType::Scalar => {
                let text = get(SCALAR_UNIT).unwrap_or("SECONDS");
                Some(Unit::parse(text).ok_or_else(|| format!("`{}` is {text:?}, not a time unit", key(SCALAR_UNIT)))?)
            }
            TimestampType::DateString | TimestampType::Mixed => None,
        };
        let compile =
            |suffix: &str, text: &str| Pattern::compile(text).map_err(|why| format!("`{}`: {why}", key(suffix)));
        let inputs = match (unit, get(INPUT_FORMAT)) {
            (None, None) => return Err(format!("`{}` is required for {kind:?}", key(INPUT_FORMAT))),
            (_, None) => vec![],
            (_, Some(text)) => {
                let delimiter = delimiter(get(INPUT_DELIMITER).unwrap_or(","))
                    .ok_or_else(|| format!("`{}`: only a literal delimiter is supported", key(INPUT_DELIMITER)))?;
                text.split(delimiter.as_str())
                    .map(str::trim)
                    .filter(|p| !p.is_empty())
                    .map(|p| compile(INPUT_FORMAT, p))
                    .collect::<std::result::Result<_, _>>()?
            }
        };
        let zone = |suffix: &str| {
            get(suffix).map(|id| Zone::parse(id).map_err(|why| format!("`{}`: {why}", key(suffix)))).transpose()
        };
        let (input_zone, output_zone) = match zone(ZONE)? {
            Some(z) => (Some(z.clone()), Some(z)),
            None => (zone(INPUT_ZONE)?, zone(OUTPUT_ZONE)?),
        };
        let output =
            compile(OUTPUT_FORMAT, get(OUTPUT_FORMAT).ok_or_else(|| format!("`{}` is not set", key(OUTPUT_FORMAT)))?)?;
        Ok(TimestampFormat { kind, unit, inputs, input_zone, output, output_zone })
    }

    /// The path segment (before escaping) of every row of `col`, the partition field `name`.
    /// Null values take Apache Hudi's default (the instant 1 in the type's unit).
    pub fn segments(&self, col: &ArrayRef, name: &str) -> Result<StringArray> {
        let bad = |detail: String| Error::invalid_data(format!("partition column `{name}`: {detail}"));
        let strict = CastOptions { safe: false, ..Default::default() };
        let cast_to = |t: &DataType| cast_with_options(col, t, &strict).map_err(|e| bad(e.to_string()));
        let default = self.default_segment().map_err(&bad)?;
        let mut out: Vec<String> = Vec::with_capacity(col.len());
        let push = |out: &mut Vec<String>, v: Option<std::result::Result<String, String>>| -> Result<()> {
            out.push(match v {
                None => default.clone(),
                Some(s) => s.map_err(&bad)?,
            });
            Ok(())
        };
        match col.data_type() {
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
                let text = cast_to(&DataType::Utf8)?;
                let mut last: Option<(&str, String)> = None;
                for v in text.as_string::<i32>() {
                    // The Spark key generator takes Hudi's default-partition literal for null.
                    let v = v.filter(|v| *v != DEFAULT_PARTITION);
                    let segment = match (v, &last) {
                        (Some(v), Some((prev, s))) if *prev == v => Some(Ok(s.clone())),
                        (Some(v), _) => {
                            let s = self.format_text(v);
                            if let Ok(s) = &s {
                                last = Some((v, s.clone()));
                            }
                            Some(s)
                        }
                        (None, _) => None,
                    };
                    push(&mut out, segment)?;
                }
            }
            DataType::Timestamp(unit, _) => {
                // Arrow timestamps are instants: taken as Apache Hudi takes `java.sql.Timestamp`
                // values (with consistent logical timestamps), whatever the type's unit.
                let per_milli: fn(i64) -> i64 = match unit {
                    ArrowUnit::Second => |v| v.saturating_mul(1000),
                    ArrowUnit::Millisecond => |v| v,
                    ArrowUnit::Microsecond => |v| v / 1000,
                    ArrowUnit::Nanosecond => |v| v / 1_000_000,
                };
                for v in cast_to(&DataType::Int64)?.as_primitive::<Int64Type>() {
                    push(&mut out, v.map(|v| self.format_millis(per_milli(v), self.output_zone.as_ref())))?;
                }
            }
            DataType::Date32 | DataType::Date64 => {
                // Apache Hudi reads a date as its epoch day in the type's unit: right only for days.
                if self.kind != TimestampType::Scalar || self.unit != Some(Unit::Days) {
                    return Err(bad(format!(
                        "a date partitions by time only with `{PREFIX}{TYPE}=SCALAR` and \
                         `{PREFIX}{SCALAR_UNIT}=DAYS` (Apache Hudi reads the epoch day in the type's unit), \
                         not {:?}",
                        self.kind
                    )));
                }
                let days = cast_to(&DataType::Date32)?;
                for v in days.as_primitive::<arrow::datatypes::Date32Type>() {
                    push(&mut out, v.map(|d| self.format_number(i64::from(d))))?;
                }
            }
            DataType::Float16 | DataType::Float32 | DataType::Float64 => {
                for v in cast_to(&DataType::Float64)?.as_primitive::<Float64Type>() {
                    push(&mut out, v.map(|f| self.format_float(f)))?;
                }
            }
            t if t.is_integer() || matches!(t, DataType::Decimal128(..) | DataType::Decimal256(..)) => {
                // Decimals are truncated toward zero, as `BigDecimal.longValue()`.
                for v in cast_to(&DataType::Int64)?.as_primitive::<Int64Type>() {
                    push(&mut out, v.map(|v| self.format_number(v)))?;
                }
            }
            other => return Err(bad(format!("a {other} column cannot be a timestamp-based partition field"))),
        }
        Ok(StringArray::from(out))
    }

    fn format_millis(&self, millis: i64, zone: Option<&Zone>) -> std::result::Result<String, String> {
        self.output
            .print(millis, zone.unwrap_or(&Zone::Fixed(0)))
            .ok_or_else(|| format!("the instant {millis} ms since the epoch is out of range"))
    }

    fn format_number(&self, v: i64) -> std::result::Result<String, String> {
        match self.unit {
            Some(unit) => self.format_millis(unit.to_millis(v), self.output_zone.as_ref()),
            None => Err(format!("{v} is a number, but timestamp type {:?} takes date strings", self.kind)),
        }
    }

    fn format_float(&self, v: f64) -> std::result::Result<String, String> {
        if !v.is_finite() || v.trunc() < i64::MIN as f64 || v.trunc() >= i64::MAX as f64 {
            return Err(format!("{v} is not an instant"));
        }
        // `Double.longValue()`: the fraction is dropped.
        self.format_number(v.trunc() as i64)
    }

    fn format_text(&self, text: &str) -> std::result::Result<String, String> {
        if self.inputs.is_empty() {
            // A number written as text (Apache Hudi's SQL updates turn such columns into strings).
            return match text.trim().parse::<i64>() {
                Ok(v) => self.format_number(v),
                Err(_) => Err(format!("{text:?} is not a number of timestamp type {:?}", self.kind)),
            };
        }
        let zone = self.input_zone.clone().unwrap_or(Zone::Fixed(0));
        // The first format the whole text matches decides (Joda's parser of several formats);
        // values out of range are an error then, not a reason to try the next.
        for pattern in &self.inputs {
            let Some(parsed) = pattern.parse(text) else { continue };
            let parsed = parsed.map_err(|why| format!("{text:?} as `{}`: {why}", pattern.source()))?;
            let millis = parsed.millis(&zone).ok_or_else(|| format!("{text:?} names no instant in its time zone"))?;
            // Without an output zone, Joda prints in the zone the text was read in.
            let out = self.output_zone.clone().or(self.input_zone.clone()).or(parsed.zone).unwrap_or(Zone::Fixed(0));
            return self.format_millis(millis, Some(&out));
        }
        let formats: Vec<&str> = self.inputs.iter().map(Pattern::source).collect();
        Err(format!("{text:?} matches none of the input date formats {formats:?}"))
    }

    /// Apache Hudi's segment for a null value: the instant 1 in the type's unit, or, for date
    /// strings, the instant 1 ms printed with the first input format and read back.
    fn default_segment(&self) -> std::result::Result<String, String> {
        match (self.unit, self.inputs.first()) {
            (Some(_), _) | (None, None) => self.format_number(1),
            (None, Some(first)) => {
                let zone = self.input_zone.as_ref().or(self.output_zone.as_ref()).cloned().unwrap_or(Zone::Fixed(0));
                let text = first.print(1, &zone).ok_or("the default instant does not print")?;
                self.format_text(&text)
            }
        }
    }
}

/// Refuses options of a new table that are not `hoodie.keygen.timebased.*` ones, or do not make a
/// timestamp format for its timestamp-based fields (`timestamp`), or are given without any.
pub fn check_options(options: &BTreeMap<String, String>, timestamp: bool) -> Result<()> {
    let arg = "key_generator_options";
    if let Some(k) = options.keys().find(|k| !k.strip_prefix(PREFIX).is_some_and(|s| OPTIONS.contains(&s))) {
        let known: Vec<String> = OPTIONS.iter().map(|s| format!("{PREFIX}{s}")).collect();
        return Err(Error::invalid_arg(arg, format!("`{k}` is not one of {}", known.join(", "))));
    }
    // Tables Apache Hudi 0.14's SQL writer made may lack the type (it is taken from the input
    // format then); a new table names it, as Java's writers require.
    if timestamp && !options.contains_key(&format!("{PREFIX}{TYPE}")) {
        return Err(Error::invalid_arg(arg, format!("`{PREFIX}{TYPE}` is required")));
    }
    match (timestamp, options.is_empty()) {
        (true, _) => TimestampFormat::from_options(options).map(|_| ()).map_err(|why| Error::invalid_arg(arg, why)),
        (false, false) => Err(Error::invalid_arg(arg, "given, but no partition field is `field:timestamp`")),
        (false, true) => Ok(()),
    }
}

/// A delimiter regex that is a literal (`,`, `;`, `\|`): the literal.
fn delimiter(regex: &str) -> Option<String> {
    let mut out = String::new();
    let mut chars = regex.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.push(chars.next().filter(|c| !c.is_ascii_alphanumeric())?),
            c if ".[]{}()*+?^$|".contains(c) => return None,
            c => out.push(c),
        }
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Date32Array, Float64Array, Int64Array, TimestampMicrosecondArray};

    use super::*;

    fn format(options: &[(&str, &str)]) -> TimestampFormat {
        let map = options.iter().map(|(k, v)| (format!("{PREFIX}{k}"), v.to_string())).collect();
        TimestampFormat::from_options(&map).unwrap()
    }

    fn segments(f: &TimestampFormat, col: ArrayRef) -> Vec<String> {
        f.segments(&col, "ts").unwrap().iter().map(|s| s.unwrap().to_string()).collect()
    }

    /// The expectations of Apache Hudi's `TestTimestampBasedKeyGenerator`.
    #[test]
    fn as_apache_hudis_tests() {
        let millis = format(&[(TYPE, "EPOCHMILLISECONDS"), (OUTPUT_FORMAT, "yyyy-MM-dd hh"), (ZONE, "GMT+8:00")]);
        let col: ArrayRef = Arc::new(Int64Array::from(vec![Some(1_578_283_932_000), None]));
        assert_eq!(segments(&millis, col), ["2020-01-06 12", "1970-01-01 08"]);
        let micros = format(&[(TYPE, "EPOCHMICROSECONDS"), (OUTPUT_FORMAT, "yyyy-MM-dd hh"), (ZONE, "GMT+8:00")]);
        assert_eq!(segments(&micros, Arc::new(Int64Array::from(vec![1_578_283_932_123_456]))), ["2020-01-06 12"]);
        let days = format(&[(TYPE, "SCALAR"), (SCALAR_UNIT, "days"), (OUTPUT_FORMAT, "yyyy-MM-dd"), (ZONE, "GMT")]);
        assert_eq!(segments(&days, Arc::new(Int64Array::from(vec![18736]))), ["2021-04-19"]);
        assert_eq!(segments(&days, Arc::new(Date32Array::from(vec![18736]))), ["2021-04-19"]);
        let strings = |out_zone: &str| {
            let mut o = vec![
                (TYPE, "DATE_STRING"),
                (INPUT_FORMAT, "yyyy-MM-dd'T'HH:mm:ssZ,yyyy-MM-dd'T'HH:mm:ss.SSSZ,yyyyMMdd"),
                (OUTPUT_FORMAT, "yyyyMMddHH"),
            ];
            if !out_zone.is_empty() {
                o.push((OUTPUT_ZONE, out_zone));
            }
            format(&o)
        };
        let text = |v: &str| -> ArrayRef { Arc::new(StringArray::from(vec![v])) };
        assert_eq!(segments(&strings("UTC"), text("2020-04-01T13:01:33-05:00")), ["2020040118"]);
        assert_eq!(segments(&strings("EST"), text("2020-04-01T13:01:33.123Z")), ["2020040109"]);
        assert_eq!(segments(&strings(""), text("2020-04-01T13:01:33.123Z")), ["2020040113"]);
        assert_eq!(segments(&strings(""), text("2020-04-01T13:01:33.123-05:00")), ["2020040113"]);
        assert_eq!(segments(&strings("UTC"), text("20200401")), ["2020040100"]);
        let null = format(&[
            (TYPE, "DATE_STRING"),
            (INPUT_FORMAT, "yyyy-MM-dd hh:mm:ss"),
            (OUTPUT_FORMAT, "yyyy-MM-dd hh:mm:ss"),
            (ZONE, "GMT"),
        ]);
        let nulls: ArrayRef = Arc::new(StringArray::from(vec![None, Some(DEFAULT_PARTITION)]));
        assert_eq!(segments(&null, nulls), ["1970-01-01 12:00:00", "1970-01-01 12:00:00"]);
    }

    #[test]
    fn the_corpus_tables_partitions() {
        let hourly = format(&[(INPUT_FORMAT, "yyyy-MM-dd'T'HH:mm:ss.SSSZ"), (OUTPUT_FORMAT, "yyyy/MM/dd/HH")]);
        let col: ArrayRef = Arc::new(StringArray::from(vec!["2023-04-01T12:01:00.123Z", "2024-01-15T10:30:00.000Z"]));
        assert_eq!(segments(&hourly, col), ["2023/04/01/12", "2024/01/15/10"]);
        let epoch = format(&[(TYPE, "EPOCHMILLISECONDS"), (OUTPUT_FORMAT, "yyyy/MM/dd/HH")]);
        assert_eq!(segments(&epoch, Arc::new(Int64Array::from(vec![1_705_311_000_000]))), ["2024/01/15/09"]);
        // The same values as text, as Apache Hudi's SQL updates left them.
        assert_eq!(segments(&epoch, Arc::new(StringArray::from(vec!["1705311000000"]))), ["2024/01/15/09"]);
        let ts: ArrayRef = Arc::new(TimestampMicrosecondArray::from(vec![1_705_311_000_000_123]).with_timezone("UTC"));
        assert_eq!(segments(&epoch, ts), ["2024/01/15/09"]);
        assert_eq!(segments(&epoch, Arc::new(Float64Array::from(vec![1_705_311_000_000.9]))), ["2024/01/15/09"]);
    }

    #[test]
    fn refuses_what_would_be_wrong() {
        let epoch = format(&[(TYPE, "EPOCHMILLISECONDS"), (OUTPUT_FORMAT, "yyyy/MM/dd")]);
        let err = epoch.segments(&(Arc::new(Date32Array::from(vec![19000])) as ArrayRef), "d").unwrap_err();
        assert!(err.to_string().contains("`d`"), "{err}");
        assert!(epoch.segments(&(Arc::new(Float64Array::from(vec![f64::NAN])) as ArrayRef), "x").is_err());
        let text = format(&[(TYPE, "DATE_STRING"), (INPUT_FORMAT, "yyyy-MM-dd"), (OUTPUT_FORMAT, "yyyy")]);
        let err = text.segments(&(Arc::new(StringArray::from(vec!["01/02/2024"])) as ArrayRef), "d").unwrap_err();
        assert!(err.to_string().contains("01/02/2024"), "{err}");
        assert!(text.segments(&(Arc::new(Int64Array::from(vec![1])) as ArrayRef), "d").is_err());
        let bad = |o: &[(&str, &str)]| {
            let map = o.iter().map(|(k, v)| (format!("{PREFIX}{k}"), v.to_string())).collect();
            TimestampFormat::from_options(&map).unwrap_err()
        };
        assert!(bad(&[(OUTPUT_FORMAT, "yyyy")]).contains(TYPE));
        assert!(bad(&[(TYPE, "epochmilliseconds"), (OUTPUT_FORMAT, "yyyy")]).contains("upper case"));
        assert!(bad(&[(TYPE, "DATE_STRING"), (OUTPUT_FORMAT, "yyyy")]).contains(INPUT_FORMAT));
        assert!(bad(&[(TYPE, "UNIX_TIMESTAMP"), (OUTPUT_FORMAT, "yyyy"), (ZONE, "Nowhere")]).contains(ZONE));
        assert!(bad(&[(TYPE, "UNIX_TIMESTAMP")]).contains(OUTPUT_FORMAT));
        // The deprecated names are read too.
        let map = [
            ("hoodie.deltastreamer.keygen.timebased.timestamp.type", "UNIX_TIMESTAMP"),
            ("hoodie.keygen.timebased.output.dateformat", "yyyy"),
        ];
        let map = map.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        assert!(TimestampFormat::from_options(&map).is_ok());
    }
}
