//! A Kubernetes equality-based label selector (`app=checkout,tier!=batch`), as `kubectl -l`
//! takes it: the pods whose allocators the `alloc` group probes.
use std::{collections::BTreeMap, fmt};

use anyhow::{bail, ensure, Result};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodSelector {
    /// (key, value, whether the label must equal it or must not).
    terms: Vec<(String, String, bool)>,
}

impl PodSelector {
    pub fn parse(text: &str) -> Result<PodSelector> {
        let mut terms = Vec::new();
        for term in text.split(',').map(str::trim) {
            let (key, value, equal) = if let Some((k, v)) = term.split_once("!=") {
                (k, v, false)
            } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                (k, v, true)
            } else {
                bail!("pod selector term {term:?} is not key=value or key!=value (set-based selectors are not supported)");
            };
            let (key, value) = (key.trim(), value.trim());
            ensure!(valid_key(key), "pod selector key {key:?} is not a Kubernetes label key");
            ensure!(valid_value(value), "pod selector value {value:?} is not a Kubernetes label value");
            terms.push((key.to_string(), value.to_string(), equal));
        }
        Ok(PodSelector { terms })
    }

    /// Whether a pod with these labels is selected. A missing label is not equal to any value.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.terms.iter().all(|(key, value, equal)| (labels.get(key) == Some(value)) == *equal)
    }
}

impl fmt::Display for PodSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let terms: Vec<String> = self.terms.iter().map(|(k, v, equal)| format!("{k}{}{v}", if *equal { "=" } else { "!=" })).collect();
        f.write_str(&terms.join(","))
    }
}

/// `[prefix/]name`: a DNS subdomain prefix, a name of up to 63 characters.
fn valid_key(key: &str) -> bool {
    let (prefix, name) = key.rsplit_once('/').map_or((None, key), |(p, n)| (Some(p), n));
    let prefix_ok = prefix.is_none_or(|p| !p.is_empty() && p.len() <= 253 && p.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.'));
    prefix_ok && !name.is_empty() && valid_value(name)
}

/// Up to 63 alphanumerics, `-`, `_` and `.`, starting and ending alphanumeric (or empty).
fn valid_value(value: &str) -> bool {
    let edge = |c: Option<char>| c.is_none_or(|c| c.is_ascii_alphanumeric());
    value.len() <= 63
        && value.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && edge(value.chars().next())
        && edge(value.chars().last())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn equality_and_inequality_terms_all_hold() {
        let selector = PodSelector::parse("app=checkout, tier!=batch,app.kubernetes.io/version==1.2").unwrap();
        assert_eq!(selector.to_string(), "app=checkout,tier!=batch,app.kubernetes.io/version=1.2");
        assert!(selector.matches(&labels(&[("app", "checkout"), ("app.kubernetes.io/version", "1.2")])));
        assert!(!selector.matches(&labels(&[("app", "checkout"), ("app.kubernetes.io/version", "1.2"), ("tier", "batch")])));
        assert!(!selector.matches(&labels(&[("app", "checkout")])), "a missing label equals nothing");
        assert!(PodSelector::parse("tier!=batch").unwrap().matches(&labels(&[])), "a missing label differs from any value");
    }

    #[test]
    fn what_is_not_a_selector_is_refused_with_the_term() {
        for (text, says) in [
            ("app", "\"app\" is not key=value"),
            ("app in (a,b)", "is not key=value"),
            ("=x", "key \"\""),
            ("app=a b", "value \"a b\""),
            ("app=x';DROP", "value"),
            ("Bad.Prefix/app=x", "key"),
        ] {
            let error = PodSelector::parse(text).unwrap_err().to_string();
            assert!(error.contains(says), "{text}: {error}");
        }
    }
}
