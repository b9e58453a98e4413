//! envoyproxy/ratelimit's YAML files, read into the engine's configuration.
//!
//! One file is one domain. `--config` names files or folders (every `*.yaml` and `*.yml` in a
//! folder, in name order). Unknown fields are refused, so a typo cannot silently drop a limit.

use std::path::{Path, PathBuf};

use atomic_limiter::rls::{ConfigError, Descriptor, DomainConfig, RateLimit, Unit};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    domain: String,
    #[serde(default)]
    descriptors: Vec<Node>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Node {
    key: String,
    value: Option<String>,
    rate_limit: Option<Limit>,
    #[serde(default)]
    shadow_mode: bool,
    /// Counted per limit already; the full value is never a label (unbounded cardinality).
    #[serde(default)]
    #[allow(dead_code)]
    detailed_metric: bool,
    #[serde(default)]
    descriptors: Vec<Node>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Limit {
    unit: Option<String>,
    requests_per_unit: Option<u32>,
    #[serde(default)]
    unlimited: bool,
    /// This service's own: the burst, when it should differ from `requests_per_unit`.
    burst: Option<u32>,
    #[allow(dead_code)]
    name: Option<String>,
    #[serde(default)]
    replaces: Vec<Replaced>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Replaced {
    #[allow(dead_code)]
    name: String,
}

/// What loading found beyond the domains: notes an operator should read.
#[derive(Debug, Default)]
pub struct Loaded {
    pub domains: Vec<DomainConfig>,
    pub files: Vec<PathBuf>,
    pub warnings: Vec<String>,
}

/// Reads every file `paths` name (folders: their YAML files).
pub fn load(paths: &[PathBuf]) -> Result<Loaded, ConfigError> {
    let mut loaded = Loaded::default();
    for path in paths {
        if path.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|e| unreadable(path, e.to_string()))?
                .filter_map(|entry| entry.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
                .collect();
            files.sort();
            loaded.files.extend(files);
        } else {
            loaded.files.push(path.clone());
        }
    }
    if loaded.files.is_empty() {
        return Err(ConfigError::Unreadable {
            at: paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            why: "no configuration file found".into(),
        });
    }
    for file in loaded.files.clone() {
        let text = std::fs::read_to_string(&file).map_err(|e| unreadable(&file, e.to_string()))?;
        let domain = parse(&text, &file.display().to_string(), &mut loaded.warnings)?;
        loaded.domains.push(domain);
    }
    Ok(loaded)
}

fn unreadable(path: &Path, why: String) -> ConfigError {
    ConfigError::Unreadable {
        at: path.display().to_string(),
        why,
    }
}

/// One file's domain; `at` names it in messages.
pub fn parse(
    text: &str,
    at: &str,
    warnings: &mut Vec<String>,
) -> Result<DomainConfig, ConfigError> {
    let file: File = serde_saphyr::from_str(text).map_err(|e| ConfigError::Unreadable {
        at: at.into(),
        why: e.to_string(),
    })?;
    let here = format!("{at}: {}", file.domain);
    Ok(DomainConfig {
        descriptors: nodes(file.descriptors, &here, warnings)?,
        domain: file.domain,
    })
}

fn nodes(
    nodes: Vec<Node>,
    at: &str,
    warnings: &mut Vec<String>,
) -> Result<Vec<Descriptor>, ConfigError> {
    nodes
        .into_iter()
        .map(|n| {
            let here = match &n.value {
                Some(v) => format!("{at}.{}_{v}", n.key),
                None => format!("{at}.{}", n.key),
            };
            let rate_limit = match n.rate_limit {
                None => None,
                Some(limit) => Some(rate_limit(limit, &here, warnings)?),
            };
            Ok(Descriptor {
                key: n.key,
                value: n.value,
                rate_limit,
                shadow_mode: n.shadow_mode,
                descriptors: self::nodes(n.descriptors, &here, warnings)?,
            })
        })
        .collect()
}

fn rate_limit(
    limit: Limit,
    at: &str,
    warnings: &mut Vec<String>,
) -> Result<RateLimit, ConfigError> {
    if !limit.replaces.is_empty() {
        // Every matching limit then applies, the replaced ones too: stricter, never looser.
        warnings.push(format!(
            "{at}: `replaces` is not supported; the replaced limits still apply"
        ));
    }
    if limit.unlimited {
        return Ok(RateLimit::Unlimited);
    }
    let bad = || ConfigError::BadLimit { at: at.into() };
    let unit = limit.unit.ok_or_else(bad)?;
    let unit = Unit::from_name(&unit).map_err(|_| ConfigError::Unit {
        unit,
        at: at.into(),
    })?;
    Ok(RateLimit::Limited {
        unit,
        requests_per_unit: limit.requests_per_unit.ok_or_else(bad)?,
        burst: limit.burst,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500
  - key: database
    value: default
    shadow_mode: true
    detailed_metric: true
    rate_limit:
      unit: SECOND
      requests_per_unit: 500
  - key: remote_address
    rate_limit:
      unlimited: true
  - key: path
    descriptors:
      - key: user
        rate_limit:
          name: per_user
          unit: hour
          requests_per_unit: 10
          burst: 2
          replaces:
            - name: other
"#;

    #[test]
    fn envoyproxy_ratelimits_format_reads() {
        let mut warnings = Vec::new();
        let d = parse(EXAMPLE, "example.yaml", &mut warnings).unwrap();
        assert_eq!(d.domain, "mongo_cps");
        assert_eq!(d.descriptors.len(), 4);
        assert!(d.descriptors[1].shadow_mode);
        assert_eq!(d.descriptors[2].rate_limit, Some(RateLimit::Unlimited));
        assert_eq!(
            d.descriptors[3].descriptors[0].rate_limit,
            Some(RateLimit::Limited {
                unit: Unit::Hour,
                requests_per_unit: 10,
                burst: Some(2)
            })
        );
        assert_eq!(warnings.len(), 1, "{warnings:?}");
    }

    #[test]
    fn a_fault_is_told_with_its_place() {
        let mut w = Vec::new();
        let month = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: month, requests_per_unit: 5}\n";
        let e = parse(month, "f.yaml", &mut w).unwrap_err().to_string();
        assert!(e.contains("f.yaml: d.k") && e.contains("month"), "{e}");
        let typo = "domain: d\ndescriptors:\n  - key: k\n    rate_limt: {unit: second, requests_per_unit: 5}\n";
        let e = parse(typo, "f.yaml", &mut w).unwrap_err().to_string();
        assert!(e.contains("rate_limt"), "{e}");
        let no_rate = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second}\n";
        assert!(matches!(
            parse(no_rate, "f", &mut w),
            Err(ConfigError::BadLimit { .. })
        ));
        assert!(parse("not: [valid", "f", &mut w).is_err());
    }
}
