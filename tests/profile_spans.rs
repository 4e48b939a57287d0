//! `DCKPT_PROFILE`'s steps are `tracing` spans too: an application's own
//! subscriber sees them nested as they ran, with the step, version and rank.
#![allow(unsafe_code)] // set_var before any thread starts (the only test here)
#![allow(clippy::unwrap_used)] // tests may panic on setup failures

use std::sync::{Arc, Mutex};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// (step, version, the parent's step) of each span seen.
type Seen = Arc<Mutex<Vec<(String, u64, Option<String>)>>>;

#[derive(Default)]
struct Fields {
    step: String,
    version: u64,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "step" {
            self.step = value.to_string();
        }
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "version" {
            self.version = value;
        }
    }
    fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
}

struct Record(Seen);

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Record {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut f = Fields::default();
        attrs.record(&mut f);
        let parent = ctx.span(id).and_then(|s| s.parent()).and_then(|p| p.extensions().get::<String>().cloned());
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(f.step.clone());
        }
        self.0.lock().unwrap().push((f.step, f.version, parent));
    }
}

#[test]
fn profile_steps_are_nested_tracing_spans_with_their_fields() {
    // SAFETY: the only test of this binary; no other thread reads the environment yet.
    unsafe { std::env::set_var("DCKPT_PROFILE", "1") };
    let seen: Seen = Arc::default();
    let subscriber = tracing_subscriber::registry().with(Record(seen.clone()));
    tracing::subscriber::with_default(subscriber, || {
        let _call = dckpt::profile::Span::new("runtime-call", 7);
        let _inner = dckpt::profile::Span::new("dedup-cache", 7);
    });
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![("runtime-call".to_string(), 7, None), ("dedup-cache".to_string(), 7, Some("runtime-call".to_string()))]
    );
}
