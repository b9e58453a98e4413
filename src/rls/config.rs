//! A rate-limit service's configuration, in the form envoyproxy/ratelimit's YAML files take, and
//! its check before it is put in force.

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;
use core::time::Duration;

use crate::quota::Quota;

/// The time unit of a limit: `requests_per_unit` requests per one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Unit {
    /// One second.
    Second,
    /// One minute.
    Minute,
    /// One hour.
    Hour,
    /// One day (86 400 s).
    Day,
    /// One week (7 days).
    Week,
}

impl Unit {
    /// The unit named `name` as envoyproxy/ratelimit's files write it (`second` … `week`, any
    /// case). `month` and `year` are refused: their length varies with the calendar, and a GCRA
    /// whose period is a 30th of a month would pass a whole month's requests at its first
    /// instant; they come with calendar windows.
    pub fn from_name(name: &str) -> Result<Unit, ConfigError> {
        let unit = match name.to_ascii_lowercase().as_str() {
            "second" => Unit::Second,
            "minute" => Unit::Minute,
            "hour" => Unit::Hour,
            "day" => Unit::Day,
            "week" => Unit::Week,
            _ => {
                return Err(ConfigError::Unit {
                    unit: name.into(),
                    at: String::new(),
                });
            }
        };
        Ok(unit)
    }

    /// The unit's length.
    pub const fn duration(self) -> Duration {
        Duration::from_secs(match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 604_800,
        })
    }

    /// The unit's name, upper case, as Envoy's protocol names it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Unit::Second => "SECOND",
            Unit::Minute => "MINUTE",
            Unit::Hour => "HOUR",
            Unit::Day => "DAY",
            Unit::Week => "WEEK",
        }
    }
}

/// What a descriptor node limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateLimit {
    /// `requests_per_unit` per `unit`, with a burst of `requests_per_unit` unless `burst` says
    /// otherwise.
    Limited {
        /// The unit.
        unit: Unit,
        /// Requests per unit.
        requests_per_unit: u32,
        /// How many may pass at once after an idle (`requests_per_unit` when `None`).
        burst: Option<u32>,
    },
    /// Matches, and never limits (`unlimited: true`).
    Unlimited,
}

impl RateLimit {
    /// The quota a limited node holds each of its keys to.
    pub fn quota(&self) -> Option<Quota> {
        match *self {
            RateLimit::Limited {
                unit,
                requests_per_unit,
                burst,
            } => Quota::try_new(
                u64::from(requests_per_unit),
                unit.duration(),
                burst.unwrap_or(requests_per_unit),
            )
            .ok(),
            RateLimit::Unlimited => None,
        }
    }
}

/// One node of a domain's descriptor tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    /// The entry key this node matches.
    pub key: String,
    /// The entry value it matches; `None` matches any value, each value limited apart.
    pub value: Option<String>,
    /// The limit of a request whose descriptor ends here; `None`: no limit.
    pub rate_limit: Option<RateLimit>,
    /// Answer OK, and count what would have been refused.
    pub shadow_mode: bool,
    /// Nodes for the descriptor's next entry.
    pub descriptors: Vec<Descriptor>,
}

/// One domain's configuration (one YAML file of envoyproxy/ratelimit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainConfig {
    /// The domain requests name.
    pub domain: String,
    /// Its descriptor tree.
    pub descriptors: Vec<Descriptor>,
}

/// Why a configuration is refused; the configuration in force is then kept.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// A domain with an empty name.
    EmptyDomain,
    /// Two configurations of one domain.
    DuplicateDomain {
        /// The domain.
        domain: String,
    },
    /// A descriptor node with an empty key.
    EmptyKey {
        /// Where: the domain and the path to the node.
        at: String,
    },
    /// Two sibling nodes with the same key and value.
    DuplicateDescriptor {
        /// Where.
        at: String,
    },
    /// A unit this service does not take.
    Unit {
        /// The unit as written.
        unit: String,
        /// Where.
        at: String,
    },
    /// A limit of 0 requests, or one whose quota cannot be held (a burst of 0).
    BadLimit {
        /// Where.
        at: String,
    },
    /// Something else the file says that cannot be read (its reader's message).
    Unreadable {
        /// The file, or the part of it.
        at: String,
        /// Why.
        why: String,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::EmptyDomain => f.write_str("a configuration has an empty `domain`"),
            ConfigError::DuplicateDomain { domain } => {
                write!(f, "domain `{domain}` is configured twice")
            }
            ConfigError::EmptyKey { at } => write!(f, "{at}: a descriptor has an empty `key`"),
            ConfigError::DuplicateDescriptor { at } => {
                write!(f, "{at}: two descriptors have this key and value")
            }
            ConfigError::Unit { unit, at } => write!(
                f,
                "{at}: unit `{unit}` is not one of second, minute, hour, day, week (month and year vary with the calendar)"
            ),
            ConfigError::BadLimit { at } => {
                write!(
                    f,
                    "{at}: `requests_per_unit` (and any burst) must be at least 1"
                )
            }
            ConfigError::Unreadable { at, why } => write!(f, "{at}: {why}"),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Checks `domains`: names, keys, siblings and limits; the first fault found.
pub(super) fn check(domains: &[DomainConfig]) -> Result<(), ConfigError> {
    for (i, d) in domains.iter().enumerate() {
        if d.domain.is_empty() {
            return Err(ConfigError::EmptyDomain);
        }
        if domains[..i].iter().any(|o| o.domain == d.domain) {
            return Err(ConfigError::DuplicateDomain {
                domain: d.domain.clone(),
            });
        }
        check_nodes(&d.descriptors, &d.domain)?;
    }
    Ok(())
}

fn check_nodes(nodes: &[Descriptor], at: &str) -> Result<(), ConfigError> {
    for (i, n) in nodes.iter().enumerate() {
        let here = path(at, &n.key, n.value.as_deref());
        if n.key.is_empty() {
            return Err(ConfigError::EmptyKey { at: here });
        }
        if nodes[..i]
            .iter()
            .any(|o| o.key == n.key && o.value == n.value)
        {
            return Err(ConfigError::DuplicateDescriptor { at: here });
        }
        if let Some(limit @ RateLimit::Limited { .. }) = &n.rate_limit {
            if limit.quota().is_none() {
                return Err(ConfigError::BadLimit { at: here });
            }
        }
        check_nodes(&n.descriptors, &here)?;
    }
    Ok(())
}

/// A node's place, as messages, metrics and rule names write it: `domain.key_value.key`.
pub(super) fn path(at: &str, key: &str, value: Option<&str>) -> String {
    let mut p = String::with_capacity(at.len() + key.len() + 16);
    p.push_str(at);
    p.push('.');
    p.push_str(key);
    if let Some(v) = value {
        p.push('_');
        p.push_str(v);
    }
    p
}
