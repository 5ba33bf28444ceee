//! Progress of `dmkit bench seeds`: an indicatif bar on a terminal (runs done / total, the
//! current section and step, elapsed, estimate), plain lines otherwise; and the list of every
//! command run, for the report. Fed by the harness's [`Observer`] events.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::bench::harness::process::{Event, Observer};

/// The observer of one `bench seeds` run.
pub struct Progress {
    bar: Option<ProgressBar>,
    start: Instant,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    done: u64,
    total: u64,
    section: String,
    commands: Vec<String>,
}

impl Progress {
    /// A bar when stderr is a terminal and `bar`, else plain lines.
    pub fn new(total: u64, bar: bool) -> Progress {
        let bar = (bar && std::io::stderr().is_terminal()).then(|| {
            let b = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            b.set_style(
                ProgressStyle::with_template(
                    "{bar:30} {pos}/{len} runs  {elapsed_precise} elapsed, ~{eta} left  {msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            b
        });
        Progress {
            bar,
            start: Instant::now(),
            state: Mutex::new(State {
                total,
                ..State::default()
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A section begins.
    pub fn section(&self, seed: &str, what: &str) {
        let line = format!("seed {seed}: {what}");
        self.state().section = format!("seed {seed}");
        self.line(&line);
    }

    /// Count runs a section did not make (it stopped early), so the bar still ends full.
    pub fn settle(&self, expected_end: u64) {
        let mut s = self.state();
        if s.done < expected_end {
            s.done = expected_end;
            if let Some(b) = &self.bar {
                b.set_position(expected_end);
            }
        }
    }

    /// Runs done so far.
    pub fn done(&self) -> u64 {
        self.state().done
    }

    /// Every command run so far.
    pub fn commands(&self) -> Vec<String> {
        self.state().commands.clone()
    }

    fn line(&self, msg: &str) {
        match &self.bar {
            Some(b) => b.set_message(msg.to_string()),
            None => {
                let s = self.state();
                eprintln!(
                    "[{:>5.0} s, {}/{} runs] {msg}",
                    self.start.elapsed().as_secs_f64(),
                    s.done,
                    s.total
                );
            }
        }
    }

    /// The bar's end.
    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

impl Observer for Progress {
    fn event(&self, e: Event) {
        match e {
            Event::Say(m) => {
                let section = self.state().section.clone();
                self.line(&format!("{section}: {m}"));
            }
            Event::Command(c) => self.state().commands.push(c),
            Event::RunDone => {
                let mut s = self.state();
                s.done += 1;
                if let Some(b) = &self.bar {
                    b.set_position(s.done);
                }
            }
        }
    }
}
