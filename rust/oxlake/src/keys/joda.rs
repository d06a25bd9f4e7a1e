//! Date patterns as Apache Hudi's timestamp-based key generator reads and prints them: Joda-Time's
//! `DateTimeFormat.forPattern` (docs/KEY_GENERATORS.md). The letters differ from strftime's: `hh`
//! is the clock hour 1–12, `SSS` the first three digits of the fraction, `Z` an offset `+0800`,
//! `ZZ` one with a colon, `ZZZ` a zone id; text in `'quotes'` and every non-letter is literal.
//! Letters oxlake does not implement (eras, centuries, week years, zone names) are refused when
//! the pattern is compiled, never printed wrong.

use chrono::{DateTime, Datelike, NaiveDate, NaiveDateTime, NaiveTime, Offset, TimeZone, Timelike};

/// A time zone as Java names it for Hudi (`TimeZone.getTimeZone`, then Joda's conversion).
#[derive(Clone, Debug, PartialEq)]
pub enum Zone {
    /// A fixed offset in seconds east of UTC (`UTC`, `GMT+08:00`, an offset parsed from text).
    Fixed(i32),
    /// A zone of the IANA database.
    Named(chrono_tz::Tz),
}

/// Joda's conversions of Java's three-letter zone ids (`DateTimeZone.forTimeZone`).
const JAVA_SHORT_IDS: [(&str, &str); 32] = [
    ("WET", "WET"),
    ("CET", "CET"),
    ("MET", "CET"),
    ("ECT", "CET"),
    ("EET", "EET"),
    ("MIT", "Pacific/Apia"),
    ("HST", "Pacific/Honolulu"),
    ("AST", "America/Anchorage"),
    ("PST", "America/Los_Angeles"),
    ("MST", "America/Denver"),
    ("PNT", "America/Phoenix"),
    ("CST", "America/Chicago"),
    ("EST", "America/New_York"),
    ("IET", "America/Indiana/Indianapolis"),
    ("PRT", "America/Puerto_Rico"),
    ("CNT", "America/St_Johns"),
    ("AGT", "America/Argentina/Buenos_Aires"),
    ("BET", "America/Sao_Paulo"),
    ("ART", "Africa/Cairo"),
    ("CAT", "Africa/Harare"),
    ("EAT", "Africa/Addis_Ababa"),
    ("NET", "Asia/Yerevan"),
    ("PLT", "Asia/Karachi"),
    ("IST", "Asia/Kolkata"),
    ("BST", "Asia/Dhaka"),
    ("VST", "Asia/Ho_Chi_Minh"),
    ("CTT", "Asia/Shanghai"),
    ("JST", "Asia/Tokyo"),
    ("ACT", "Australia/Darwin"),
    ("AET", "Australia/Sydney"),
    ("SST", "Pacific/Guadalcanal"),
    ("NST", "Pacific/Auckland"),
];

impl Zone {
    /// The zone Java gives `id`: `UTC`/`GMT`, `GMT+8`, `GMT+08:00`, `GMT-0530`, an IANA name, or
    /// one of Java's three-letter ids. Java turns an id it does not know into GMT without a word;
    /// oxlake refuses it (`Err` holds why).
    pub fn parse(id: &str) -> std::result::Result<Zone, String> {
        let id = id.trim();
        if matches!(id, "UTC" | "GMT" | "UT" | "Z") {
            return Ok(Zone::Fixed(0));
        }
        if let Some(rest) = id.strip_prefix("GMT").filter(|r| r.starts_with(['+', '-'])) {
            return gmt_offset(rest).map(Zone::Fixed).ok_or_else(|| format!("`{id}` is not a valid GMT offset"));
        }
        let name = JAVA_SHORT_IDS.iter().find(|(short, _)| *short == id).map_or(id, |(_, long)| *long);
        name.parse::<chrono_tz::Tz>()
            .map(Zone::Named)
            .map_err(|_| format!("`{id}` is not a time zone id (an IANA name such as `Asia/Shanghai`, or `GMT+08:00`)"))
    }

    /// The offset (seconds east of UTC) at the instant `utc`.
    fn offset_at(&self, utc: NaiveDateTime) -> i32 {
        match self {
            Zone::Fixed(s) => *s,
            Zone::Named(tz) => tz.offset_from_utc_datetime(&utc).fix().local_minus_utc(),
        }
    }

    /// The instant (as UTC) of a wall-clock time in this zone: the earlier one where clocks are
    /// set back; a time skipped when clocks go forward is refused.
    fn to_utc(&self, local: NaiveDateTime) -> Option<NaiveDateTime> {
        match self {
            Zone::Fixed(s) => local.checked_sub_signed(chrono::TimeDelta::seconds(i64::from(*s))),
            Zone::Named(tz) => tz.from_local_datetime(&local).earliest().map(|d| d.naive_utc()),
        }
    }

    /// The id Joda prints for `ZZZ`.
    fn id(&self) -> String {
        match self {
            Zone::Fixed(0) => "UTC".to_string(),
            Zone::Fixed(s) => offset_text(*s, true),
            Zone::Named(tz) => tz.name().to_string(),
        }
    }
}

/// `+8`, `+08`, `+8:00`, `+08:00`, `+0800` (Java's custom GMT ids) in seconds.
fn gmt_offset(text: &str) -> Option<i32> {
    let sign = if text.starts_with('-') { -1 } else { 1 };
    // Digits and a colon only: the slicing below is by bytes.
    let body = text.strip_prefix(['+', '-']).filter(|b| b.is_ascii())?;
    let (h, m) = match body.split_once(':') {
        Some((h, m)) if (1..=2).contains(&h.len()) && m.len() == 2 => (h, m),
        None if (1..=2).contains(&body.len()) => (body, "0"),
        None if body.len() == 4 => (&body[..2], &body[2..]),
        _ => return None,
    };
    if !h.bytes().chain(m.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (h, m): (i32, i32) = (h.parse().ok()?, m.parse().ok()?);
    (h <= 23 && m <= 59).then_some(sign * (h * 3600 + m * 60))
}

fn offset_text(seconds: i32, colon: bool) -> String {
    let sign = if seconds < 0 { '-' } else { '+' };
    let minutes = seconds.unsigned_abs() / 60;
    let sep = if colon { ":" } else { "" };
    format!("{sign}{:02}{sep}{:02}", minutes / 60, minutes % 60)
}

/// A compiled pattern.
#[derive(Clone, Debug, PartialEq)]
pub struct Pattern {
    source: String,
    tokens: Vec<Token>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    Year,
    Month,
    Day,
    DayOfYear,
    /// `H`: 0–23.
    HourOfDay,
    /// `k`: 1–24.
    ClockHourOfDay,
    /// `K`: 0–11.
    HourOfHalfDay,
    /// `h`: 1–12.
    ClockHourOfHalfDay,
    Minute,
    Second,
    /// `e`: 1 (Monday) to 7.
    DayOfWeek,
}

impl Field {
    /// The most digits Joda reads for the field (a year reads only as many as its letters when
    /// a number follows it).
    fn max_digits(self) -> usize {
        match self {
            Field::Year => 9,
            Field::DayOfYear => 3,
            Field::DayOfWeek => 1,
            _ => 2,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Literal(String),
    /// A number printed with at least `min` digits, read with at most `max`.
    Number {
        field: Field,
        min: usize,
        max: usize,
    },
    /// `yy`: the year modulo 100 (read with Joda's pivot of the current year less 30).
    TwoDigitYear {
        lenient: bool,
    },
    MonthText {
        full: bool,
    },
    DayOfWeekText {
        full: bool,
    },
    HalfDay,
    /// `S…`: the first `digits` digits of the fraction of the second.
    Fraction {
        digits: usize,
    },
    /// `Z` (`+0800`) or `ZZ` (`+08:00`); either is read, as is a bare `Z` for UTC.
    Offset {
        colon: bool,
    },
    /// `ZZZ`: the zone id.
    ZoneId,
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

impl Pattern {
    /// Compiles a Joda pattern; `Err` names the part oxlake cannot honour.
    pub fn compile(source: &str) -> std::result::Result<Pattern, String> {
        let chars: Vec<char> = source.chars().collect();
        // Letters and their run lengths first: whether the next token is a number decides how
        // many digits a number reads.
        let mut raw: Vec<(char, usize)> = Vec::new();
        let mut literals: Vec<Option<String>> = Vec::new();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            if c == '\'' {
                let mut text = String::new();
                i += 1;
                loop {
                    match chars.get(i) {
                        None => return Err(format!("unterminated quote in `{source}`")),
                        Some('\'') if chars.get(i + 1) == Some(&'\'') => {
                            text.push('\'');
                            i += 2;
                        }
                        Some('\'') => {
                            i += 1;
                            break;
                        }
                        Some(ch) => {
                            text.push(*ch);
                            i += 1;
                        }
                    }
                }
                // `''` outside a quoted text is one quote.
                raw.push(('\'', 0));
                literals.push(Some(if text.is_empty() { "'".to_string() } else { text }));
            } else if c.is_ascii_alphabetic() {
                let mut n = 1;
                while chars.get(i + n) == Some(&c) {
                    n += 1;
                }
                raw.push((c, n));
                literals.push(None);
                i += n;
            } else {
                raw.push(('\'', 0));
                literals.push(Some(c.to_string()));
                i += 1;
            }
        }
        let numeric_letter = |c: char, n: usize| match c {
            'M' => n < 3,
            'E' | 'a' | 'z' | 'Z' | '\'' => false,
            c => c.is_ascii_alphabetic(),
        };
        let mut tokens: Vec<Token> = Vec::with_capacity(raw.len());
        for (k, (&(c, n), literal)) in raw.iter().zip(&literals).enumerate() {
            if let Some(text) = literal {
                match tokens.last_mut() {
                    Some(Token::Literal(prev)) => prev.push_str(text),
                    _ => tokens.push(Token::Literal(text.clone())),
                }
                continue;
            }
            let next_numeric = raw.get(k + 1).is_some_and(|&(c2, n2)| numeric_letter(c2, n2));
            let number = |field: Field| {
                let max = if field == Field::Year && next_numeric { n } else { field.max_digits().max(n) };
                Token::Number { field, min: n, max }
            };
            tokens.push(match c {
                'y' | 'Y' if n == 2 => Token::TwoDigitYear { lenient: !next_numeric },
                'y' | 'Y' => number(Field::Year),
                'M' if n >= 3 => Token::MonthText { full: n >= 4 },
                'M' => number(Field::Month),
                'd' => number(Field::Day),
                'D' => number(Field::DayOfYear),
                'H' => number(Field::HourOfDay),
                'k' => number(Field::ClockHourOfDay),
                'K' => number(Field::HourOfHalfDay),
                'h' => number(Field::ClockHourOfHalfDay),
                'm' => number(Field::Minute),
                's' => number(Field::Second),
                'e' => number(Field::DayOfWeek),
                'S' => Token::Fraction { digits: n },
                'E' => Token::DayOfWeekText { full: n >= 4 },
                'a' => Token::HalfDay,
                'Z' if n == 1 => Token::Offset { colon: false },
                'Z' if n == 2 => Token::Offset { colon: true },
                'Z' => Token::ZoneId,
                c => {
                    return Err(format!(
                        "pattern letter `{c}` in `{source}` is not supported by oxlake (eras, centuries, week \
                         years and zone names are not)"
                    ));
                }
            });
        }
        if tokens.is_empty() {
            return Err("the pattern is empty".to_string());
        }
        Ok(Pattern { source: source.to_string(), tokens })
    }

    /// The pattern as given.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Prints the instant `millis` (since the epoch) in `zone`; `None` past chrono's range.
    pub fn print(&self, millis: i64, zone: &Zone) -> Option<String> {
        let utc = DateTime::from_timestamp_millis(millis)?.naive_utc();
        let offset = zone.offset_at(utc);
        let t = utc.checked_add_signed(chrono::TimeDelta::seconds(i64::from(offset)))?;
        let mut out = String::new();
        for token in &self.tokens {
            match token {
                Token::Literal(s) => out.push_str(s),
                Token::Number { field, min, .. } => {
                    let v: i64 = match field {
                        Field::Year => i64::from(t.year()),
                        Field::Month => i64::from(t.month()),
                        Field::Day => i64::from(t.day()),
                        Field::DayOfYear => i64::from(t.ordinal()),
                        Field::HourOfDay => i64::from(t.hour()),
                        Field::ClockHourOfDay => i64::from(if t.hour() == 0 { 24 } else { t.hour() }),
                        Field::HourOfHalfDay => i64::from(t.hour() % 12),
                        Field::ClockHourOfHalfDay => i64::from(if t.hour() % 12 == 0 { 12 } else { t.hour() % 12 }),
                        Field::Minute => i64::from(t.minute()),
                        Field::Second => i64::from(t.second()),
                        Field::DayOfWeek => i64::from(t.weekday().number_from_monday()),
                    };
                    let sign = if v < 0 { "-" } else { "" };
                    out.push_str(&format!("{sign}{:0min$}", v.unsigned_abs(), min = *min));
                }
                Token::TwoDigitYear { .. } => out.push_str(&format!("{:02}", t.year().rem_euclid(100))),
                Token::MonthText { full } => push_name(&mut out, MONTHS[t.month0() as usize], *full),
                Token::DayOfWeekText { full } => {
                    push_name(&mut out, DAYS[t.weekday().num_days_from_monday() as usize], *full)
                }
                Token::HalfDay => out.push_str(if t.hour() < 12 { "AM" } else { "PM" }),
                Token::Fraction { digits } => {
                    // Joda keeps milliseconds: their three digits, cut or padded with zeros.
                    let ms = format!("{:03}", t.and_utc().timestamp_subsec_millis());
                    let mut f: String = ms.chars().take(*digits).collect();
                    while f.len() < *digits {
                        f.push('0');
                    }
                    out.push_str(&f);
                }
                Token::Offset { colon } => out.push_str(&offset_text(offset, *colon)),
                Token::ZoneId => out.push_str(&zone.id()),
            }
        }
        Some(out)
    }

    /// Reads `text`, which must match the whole pattern (`None` otherwise): the wall-clock time and
    /// the offset or zone it names, if any; `Err` when it matches but names no time (a month 13,
    /// February 30), as Joda's parser, which checks the values once the text has matched.
    pub fn parse(&self, text: &str) -> Option<std::result::Result<Parsed, String>> {
        let mut f = Fields::default();
        let mut rest = text;
        for token in &self.tokens {
            rest = match token {
                Token::Literal(s) => strip_prefix_ignore_case(rest, s)?,
                Token::Number { field, max, .. } => {
                    let signed = *field == Field::Year;
                    let (v, r) = read_number(rest, *max, signed)?;
                    f.set(*field, v);
                    r
                }
                Token::TwoDigitYear { lenient } => {
                    let (v, r) = read_number(rest, if *lenient { 9 } else { 2 }, *lenient)?;
                    let digits = rest.len() - r.len();
                    f.year = Some(if digits == 2 && v >= 0 { two_digit_year(v) } else { v });
                    r
                }
                Token::MonthText { .. } => {
                    let (i, r) = read_name(rest, &MONTHS)?;
                    f.month = Some(i as i64 + 1);
                    r
                }
                Token::DayOfWeekText { .. } => {
                    let (i, r) = read_name(rest, &DAYS)?;
                    f.set(Field::DayOfWeek, i as i64 + 1);
                    r
                }
                Token::HalfDay => {
                    let (i, r) = read_name(rest, &["AM", "PM"])?;
                    f.pm = Some(i == 1);
                    r
                }
                Token::Fraction { digits } => {
                    let n = rest.bytes().take(*digits).take_while(u8::is_ascii_digit).count();
                    if n == 0 {
                        return None;
                    }
                    let mut ms: String = rest[..n].chars().take(3).collect();
                    while ms.len() < 3 {
                        ms.push('0');
                    }
                    f.millis = Some(ms.parse().ok()?);
                    &rest[n..]
                }
                Token::Offset { .. } => {
                    let (s, r) = read_offset(rest)?;
                    f.zone = Some(Zone::Fixed(s));
                    r
                }
                Token::ZoneId => {
                    let n =
                        rest.find(|c: char| !(c.is_ascii_alphanumeric() || "/_+-:".contains(c))).unwrap_or(rest.len());
                    f.zone = Some(Zone::parse(&rest[..n]).ok()?);
                    &rest[n..]
                }
            };
        }
        if !rest.is_empty() {
            return None;
        }
        Some(f.local().map(|local| Parsed { local, zone: f.zone.clone() }))
    }
}

/// What a pattern read: a wall-clock time, and the zone or offset the text named.
#[derive(Clone, Debug, PartialEq)]
pub struct Parsed {
    /// The wall-clock time (fields the pattern does not name from 1970-01-01T00:00, the year from
    /// 2000 when a month or day is named without one).
    pub local: NaiveDateTime,
    /// The offset or zone the text named, if the pattern reads one.
    pub zone: Option<Zone>,
}

impl Parsed {
    /// Milliseconds since the epoch, the wall-clock time taken in the text's zone, else in `zone`.
    pub fn millis(&self, zone: &Zone) -> Option<i64> {
        let zone = self.zone.as_ref().unwrap_or(zone);
        zone.to_utc(self.local).map(|u| u.and_utc().timestamp_millis())
    }
}

#[derive(Default)]
struct Fields {
    year: Option<i64>,
    month: Option<i64>,
    day: Option<i64>,
    day_of_year: Option<i64>,
    hour: Option<i64>,
    half_hour: Option<i64>,
    pm: Option<bool>,
    minute: Option<i64>,
    second: Option<i64>,
    millis: Option<u32>,
    /// 1 (Monday) to 7.
    day_of_week: Option<i64>,
    zone: Option<Zone>,
    /// The first value out of its field's range, named.
    invalid: Option<String>,
}

impl Fields {
    /// Records a value read for `field`; one out of range is remembered (Joda checks once the
    /// whole text matched).
    fn set(&mut self, field: Field, v: i64) {
        let (lo, hi) = match field {
            Field::Year => (i64::MIN, i64::MAX),
            Field::Month => (1, 12),
            Field::Day => (1, 31),
            Field::DayOfYear => (1, 366),
            Field::HourOfDay => (0, 23),
            Field::ClockHourOfDay => (1, 24),
            Field::HourOfHalfDay => (0, 11),
            Field::ClockHourOfHalfDay => (1, 12),
            Field::Minute | Field::Second => (0, 59),
            Field::DayOfWeek => (1, 7),
        };
        if !(lo..=hi).contains(&v) {
            self.invalid.get_or_insert_with(|| format!("{v} is not a valid {field:?} ({lo} to {hi})"));
            return;
        }
        match field {
            Field::Year => self.year = Some(v),
            Field::Month => self.month = Some(v),
            Field::Day => self.day = Some(v),
            Field::DayOfYear => self.day_of_year = Some(v),
            Field::HourOfDay => self.hour = Some(v),
            Field::ClockHourOfDay => self.hour = Some(v % 24),
            Field::HourOfHalfDay => self.half_hour = Some(v),
            Field::ClockHourOfHalfDay => self.half_hour = Some(v % 12),
            Field::Minute => self.minute = Some(v),
            Field::Second => self.second = Some(v),
            Field::DayOfWeek => self.day_of_week = Some(v),
        }
    }

    /// The wall-clock time, as Joda's parser bucket sets the fields read onto
    /// 1970-01-01T00:00:00.000, larger fields first: the year is 2000 when the largest field read is
    /// a month or a day (`withDefaultYear`), and a day of the week, set last, moves the date within
    /// its (Monday-first) week.
    fn local(&self) -> std::result::Result<NaiveDateTime, String> {
        if let Some(why) = &self.invalid {
            return Err(why.clone());
        }
        let dated =
            self.month.is_some() || self.day.is_some() || self.day_of_year.is_some() || self.day_of_week.is_some();
        let year = self.year.unwrap_or(if dated { 2000 } else { 1970 });
        let year = i32::try_from(year).map_err(|_| format!("year {year} is out of range"))?;
        let date = match self.day_of_year {
            Some(d) => NaiveDate::from_yo_opt(year, d as u32),
            None => NaiveDate::from_ymd_opt(year, self.month.unwrap_or(1) as u32, self.day.unwrap_or(1) as u32),
        };
        let mut date = date.ok_or_else(|| {
            format!("no such day: year {year}, month {:?}, day {:?}", self.month, self.day.or(self.day_of_year))
        })?;
        if let Some(dow) = self.day_of_week {
            let shift = dow - i64::from(date.weekday().number_from_monday());
            date = date
                .checked_add_signed(chrono::TimeDelta::days(shift))
                .ok_or_else(|| format!("year {year} is out of range"))?;
        }
        let hour = match (self.hour, self.half_hour) {
            (Some(h), _) => h,
            (None, Some(h)) => h + if self.pm == Some(true) { 12 } else { 0 },
            (None, None) => {
                if self.pm == Some(true) {
                    12
                } else {
                    0
                }
            }
        };
        // Every value was checked against its field's range in `set`.
        let time = NaiveTime::from_hms_milli_opt(
            hour as u32,
            self.minute.unwrap_or(0) as u32,
            self.second.unwrap_or(0) as u32,
            self.millis.unwrap_or(0),
        )
        .ok_or_else(|| format!("no such time: {hour}:{:?}:{:?}", self.minute, self.second))?;
        Ok(date.and_time(time))
    }
}

/// Joda's two-digit years: within 50 years before and 49 after the current year less 30.
fn two_digit_year(v: i64) -> i64 {
    let pivot = i64::from(chrono::Utc::now().year()) - 30;
    let low = pivot - 50;
    let mut year = low - low.rem_euclid(100) + v;
    if year < low {
        year += 100;
    }
    year
}

fn push_name(out: &mut String, name: &str, full: bool) {
    out.push_str(if full { name } else { &name[..3] });
}

fn strip_prefix_ignore_case<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    let head = text.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix).then(|| &text[prefix.len()..])
}

fn read_number(text: &str, max: usize, signed: bool) -> Option<(i64, &str)> {
    let (negative, body) = match text.strip_prefix('-') {
        Some(b) if signed => (true, b),
        _ => (false, text.strip_prefix('+').filter(|_| signed).unwrap_or(text)),
    };
    let n = body.bytes().take(max).take_while(u8::is_ascii_digit).count();
    if n == 0 {
        return None;
    }
    let v: i64 = body[..n].parse().ok()?;
    Some((if negative { -v } else { v }, &body[n..]))
}

/// A full or three-letter English name (case ignored): its index and the rest of the text.
fn read_name<'a>(text: &'a str, names: &[&str]) -> Option<(usize, &'a str)> {
    for (i, name) in names.iter().enumerate() {
        if let Some(r) = strip_prefix_ignore_case(text, name) {
            return Some((i, r));
        }
    }
    names.iter().enumerate().find_map(|(i, name)| strip_prefix_ignore_case(text, name.get(..3)?).map(|r| (i, r)))
}

/// `Z`, `+08`, `+0800` or `+08:00`.
fn read_offset(text: &str) -> Option<(i32, &str)> {
    if let Some(r) = text.strip_prefix(['Z', 'z']) {
        return Some((0, r));
    }
    let sign = match text.chars().next()? {
        '+' => 1,
        '-' => -1,
        _ => return None,
    };
    let body = &text[1..];
    let two = |s: &str| -> Option<i32> {
        let d = s.get(..2)?;
        d.bytes().all(|b| b.is_ascii_digit()).then(|| d.parse().ok())?
    };
    let h = two(body)?;
    let (m, used) = if body[2..].starts_with(':') {
        (two(&body[3..])?, 5)
    } else {
        match two(&body[2..]) {
            Some(m) => (m, 4),
            None => (0, 2),
        }
    };
    (h <= 23 && m <= 59).then(|| (sign * (h * 3600 + m * 60), &body[used..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Pattern {
        Pattern::compile(s).unwrap()
    }

    fn millis(text: &str, pattern: &str, zone: &Zone) -> i64 {
        p(pattern).parse(text).unwrap().unwrap().millis(zone).unwrap()
    }

    #[test]
    fn prints_as_joda() {
        let utc = Zone::Fixed(0);
        // 2020-04-01T13:01:33.123Z
        let t = 1_585_746_093_123;
        assert_eq!(p("yyyy/MM/dd/HH").print(t, &utc).unwrap(), "2020/04/01/13");
        assert_eq!(p("yyyyMMddHH").print(t, &Zone::parse("GMT+8:00").unwrap()).unwrap(), "2020040121");
        assert_eq!(p("yyyyMMddHH").print(t, &Zone::parse("EST").unwrap()).unwrap(), "2020040109");
        assert_eq!(p("yyyy-MM-dd hh").print(0, &utc).unwrap(), "1970-01-01 12");
        assert_eq!(p("yyyy-MM-dd'T'HH:mm:ss.SSSZ").print(t, &utc).unwrap(), "2020-04-01T13:01:33.123+0000");
        assert_eq!(p("ZZ ZZZ").print(t, &Zone::parse("GMT-05:30").unwrap()).unwrap(), "-05:30 -05:30");
        assert_eq!(p("ZZZ").print(t, &Zone::parse("Asia/Shanghai").unwrap()).unwrap(), "Asia/Shanghai");
        assert_eq!(p("EEE, d MMM yy h a S").print(t, &utc).unwrap(), "Wed, 1 Apr 20 1 PM 1");
        assert_eq!(p("MMMM D e SSSSS '''x''' k").print(t, &utc).unwrap(), "April 92 3 12300 'x' 13");
    }

    #[test]
    fn parses_as_joda() {
        let utc = Zone::Fixed(0);
        let f = "yyyy-MM-dd'T'HH:mm:ss.SSSZ";
        assert_eq!(millis("2020-04-01T13:01:33.123Z", f, &utc), 1_585_746_093_123);
        assert_eq!(millis("2020-04-01T13:01:33.123-05:00", f, &utc), 1_585_764_093_123);
        assert_eq!(millis("2020-04-01T13:01:33.123+0100", f, &utc), 1_585_742_493_123);
        // Adjacent numbers read their width; a date alone is midnight in the given zone.
        assert_eq!(millis("20200401", "yyyyMMdd", &Zone::parse("GMT+1").unwrap()), 1_585_695_600_000);
        assert_eq!(millis("1/4/2020 1 PM", "d/M/yyyy h a", &utc), 1_585_746_000_000);
        assert_eq!(p("yyyyMMdd").parse("202004"), None);
        assert_eq!(p("yyyy-MM-dd").parse("2020-04-01 "), None, "the whole text must match");
        // A text that matches names its values, checked after: an error, not a mismatch.
        assert!(p("yyyy-MM-dd").parse("2020-13-01").unwrap().is_err());
        assert!(p("yyyy-MM-dd").parse("2021-02-29").unwrap().is_err());
        assert_eq!(
            p("yyyy-MM-dd ZZZ").parse("2020-04-01 Asia/Tokyo").unwrap().unwrap().zone,
            Some(Zone::parse("JST").unwrap())
        );
        assert_eq!(p("yy").parse("99").unwrap().unwrap().local.year(), 1999);
        // Only a year reads as many digits as its letters before a number: `Hmm` reads two
        // digits of hour from `930` (93: no such hour), as Joda does.
        assert!(p("Hmm").parse("930").unwrap().is_err());
        assert_eq!(millis("0930", "HHmm", &utc), 34_200_000);
        // A month or day without a year is in 2000 (so that 29 February parses); a time alone
        // stays in 1970.
        assert_eq!(p("MM-dd").parse("02-29").unwrap().unwrap().local.to_string(), "2000-02-29 00:00:00");
        assert_eq!(millis("01", "HH", &utc), 3_600_000);
        // A day of the week moves the date within its week, set last.
        assert_eq!(
            p("yyyy-MM-dd EEE").parse("2024-01-15 Wed").unwrap().unwrap().local.to_string(),
            "2024-01-17 00:00:00"
        );
    }

    #[test]
    fn refuses_what_it_cannot_honour() {
        for bad in ["yyyy-ww", "G yyyy", "z", "'open", "", "uuuu"] {
            assert!(Pattern::compile(bad).is_err(), "{bad}");
        }
        for bad in ["+08:00", "Mars/Olympus", "GMT+25", "utc"] {
            assert!(Zone::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(Zone::parse("GMT+0530"), Ok(Zone::Fixed(19800)));
        for hostile in ["GMT+1é1", "GMT-éé", "GMT+1€", "GMT+é", "GMT+12:é"] {
            assert!(Zone::parse(hostile).is_err(), "{hostile}");
        }
    }

    proptest::proptest! {
        #[test]
        fn print_then_parse_is_the_same_instant(ms in -600_000_000_000i64..4_000_000_000_000i64, z in 0usize..4) {
            let zone = [Zone::Fixed(0), Zone::parse("GMT-03:30").unwrap(), Zone::parse("America/New_York").unwrap(),
                Zone::parse("Asia/Kolkata").unwrap()][z].clone();
            let pat = p("yyyy-MM-dd'T'HH:mm:ss.SSSZZ");
            let text = pat.print(ms, &zone).unwrap();
            proptest::prop_assert_eq!(pat.parse(&text).unwrap().unwrap().millis(&Zone::Fixed(0)), Some(ms));
        }
    }
}
