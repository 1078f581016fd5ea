//! Relabeling: rules in the style Prometheus users know, applied to each sample's target
//! labels before profiles leave the agent. `keep` and `drop` restrict profiling to matching
//! targets (e.g. only namespace=prod); `replace`, `labelmap`, `labeldrop` and `labelkeep`
//! reshape the labels. Regexes are anchored at both ends, as in Prometheus.
use std::collections::BTreeMap;

use anyhow::{Context as _, Result};
use regex::Regex;
use serde::Deserialize;

pub type Labels = BTreeMap<String, String>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Keep,
    Drop,
    Replace,
    Labelmap,
    Labeldrop,
    Labelkeep,
}

/// One `[[relabel]]` table of the config file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    pub action: Action,
    #[serde(default)]
    pub source_labels: Vec<String>,
    pub separator: Option<String>,
    pub regex: Option<String>,
    pub target_label: Option<String>,
    pub replacement: Option<String>,
}

#[derive(Debug)]
struct Rule {
    action: Action,
    sources: Vec<String>,
    separator: String,
    regex: Regex,
    target: String,
    replacement: String,
}

#[derive(Debug, Default)]
pub struct Relabeler {
    rules: Vec<Rule>,
}

impl Relabeler {
    pub fn new(configs: &[RuleConfig]) -> Result<Relabeler> {
        let rules = configs.iter().enumerate().map(|(i, c)| Rule::new(c).with_context(|| format!("relabel rule {}", i + 1))).collect::<Result<_>>()?;
        Ok(Relabeler { rules })
    }

    /// Applies every rule in order; false when a rule drops the target.
    pub fn apply(&self, labels: &mut Labels) -> bool {
        self.rules.iter().all(|rule| rule.apply(labels))
    }
}

impl Rule {
    fn new(c: &RuleConfig) -> Result<Rule> {
        let pattern = c.regex.as_deref().unwrap_or("(.*)");
        let regex = Regex::new(&format!("^(?:{pattern})$")).with_context(|| format!("invalid regex {pattern:?}"))?;
        let needs_sources = matches!(c.action, Action::Keep | Action::Drop | Action::Replace);
        let name = format!("{:?}", c.action).to_lowercase();
        anyhow::ensure!(!needs_sources || !c.source_labels.is_empty(), "{name} needs source_labels");
        let target = c.target_label.clone().unwrap_or_default();
        anyhow::ensure!(c.action != Action::Replace || !target.is_empty(), "replace needs target_label");
        Ok(Rule {
            action: c.action,
            sources: c.source_labels.clone(),
            separator: c.separator.clone().unwrap_or_else(|| ";".into()),
            regex,
            target,
            replacement: c.replacement.clone().unwrap_or_else(|| "$1".into()),
        })
    }

    /// The capture-expanded replacement for `value`, if the regex matches it.
    fn expand(&self, template: &str, value: &str) -> Option<String> {
        let captures = self.regex.captures(value)?;
        let mut out = String::new();
        captures.expand(template, &mut out);
        Some(out)
    }

    fn apply(&self, labels: &mut Labels) -> bool {
        let joined = || self.sources.iter().map(|s| labels.get(s).map_or("", String::as_str)).collect::<Vec<_>>().join(&self.separator);
        match self.action {
            Action::Keep => self.regex.is_match(&joined()),
            Action::Drop => !self.regex.is_match(&joined()),
            Action::Replace => {
                let value = joined();
                if let (Some(target), Some(replacement)) = (self.expand(&self.target, &value), self.expand(&self.replacement, &value)) {
                    // An empty result removes the label, as in Prometheus.
                    if replacement.is_empty() {
                        labels.remove(&target);
                    } else if !target.is_empty() {
                        labels.insert(target, replacement);
                    }
                }
                true
            }
            Action::Labelmap => {
                let mapped: Vec<(String, String)> =
                    labels.iter().filter_map(|(name, value)| Some((self.expand(&self.replacement, name)?, value.clone()))).collect();
                labels.extend(mapped.into_iter().filter(|(name, _)| !name.is_empty()));
                true
            }
            Action::Labeldrop => {
                labels.retain(|name, _| !self.regex.is_match(name));
                true
            }
            Action::Labelkeep => {
                labels.retain(|name, _| self.regex.is_match(name));
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(toml_text: &str) -> Relabeler {
        #[derive(Deserialize)]
        struct File {
            relabel: Vec<RuleConfig>,
        }
        let file: File = toml::from_str(toml_text).unwrap();
        Relabeler::new(&file.relabel).unwrap()
    }

    fn target(pairs: &[(&str, &str)]) -> Labels {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn keep_restricts_to_matching_targets() {
        let r = rules("[[relabel]]\naction = \"keep\"\nsource_labels = [\"namespace\"]\nregex = \"prod|staging\"\n");
        assert!(r.apply(&mut target(&[("namespace", "prod")])));
        assert!(r.apply(&mut target(&[("namespace", "staging")])));
        assert!(!r.apply(&mut target(&[("namespace", "production")])), "regexes are anchored");
        assert!(!r.apply(&mut target(&[("pod", "x")])), "a missing label is the empty string");
    }

    #[test]
    fn drop_removes_matching_targets() {
        let r = rules("[[relabel]]\naction = \"drop\"\nsource_labels = [\"namespace\", \"container\"]\nregex = \"kube-system;.*\"\n");
        assert!(!r.apply(&mut target(&[("namespace", "kube-system"), ("container", "coredns")])));
        assert!(r.apply(&mut target(&[("namespace", "prod"), ("container", "api")])));
    }

    #[test]
    fn replace_writes_captures_and_empty_results_remove_the_label() {
        let r = rules(
            "[[relabel]]\naction = \"replace\"\nsource_labels = [\"systemd_unit\"]\nregex = \"(.*)\\\\.service\"\ntarget_label = \"service\"\n\
             [[relabel]]\naction = \"replace\"\nsource_labels = [\"pod\"]\nregex = \"(.*)-[0-9a-f]+-[a-z0-9]{5}\"\ntarget_label = \"deployment\"\nreplacement = \"deploy-$1\"\n\
             [[relabel]]\naction = \"replace\"\nsource_labels = [\"unset\"]\ntarget_label = \"cgroup\"\n",
        );
        let mut labels = target(&[("systemd_unit", "nginx.service"), ("pod", "checkout-7f9c8d-x2k4q"), ("cgroup", "/a")]);
        assert!(r.apply(&mut labels));
        assert_eq!(labels.get("service").map(String::as_str), Some("nginx"));
        assert_eq!(labels.get("deployment").map(String::as_str), Some("deploy-checkout"));
        assert_eq!(labels.get("cgroup"), None, "an empty replacement removes the target label");
    }

    #[test]
    fn labelmap_copies_matching_names_and_labeldrop_removes_them() {
        let r = rules(
            "[[relabel]]\naction = \"labelmap\"\nregex = \"pod_label_(.+)\"\n\
             [[relabel]]\naction = \"labeldrop\"\nregex = \"pod_label_.*\"\n",
        );
        let mut labels = target(&[("pod_label_app", "checkout"), ("pod_label_tier", "web"), ("pod", "p")]);
        assert!(r.apply(&mut labels));
        assert_eq!(labels, target(&[("app", "checkout"), ("tier", "web"), ("pod", "p")]));
    }

    #[test]
    fn bad_rules_are_clear_errors() {
        let error = |text: &str| {
            let file: toml::Value = toml::from_str(text).unwrap();
            let configs: Vec<RuleConfig> = file["relabel"].clone().try_into().unwrap();
            format!("{:#}", Relabeler::new(&configs).unwrap_err())
        };
        assert!(error("[[relabel]]\naction = \"keep\"\nregex = \"x\"\n").contains("relabel rule 1: keep needs source_labels"));
        assert!(error("[[relabel]]\naction = \"replace\"\nsource_labels = [\"a\"]\n").contains("relabel rule 1: replace needs target_label"));
        assert!(error("[[relabel]]\naction = \"keep\"\nsource_labels = [\"a\"]\nregex = \"(\"\n").contains("invalid regex"));
    }
}
