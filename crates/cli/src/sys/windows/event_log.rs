//! Errors of a service also go to the Windows Event Log (Application,
//! source = the service's name), where administrators look first. The
//! source is not registered: the viewer shows the text with a note that
//! the description is missing, which is enough to read it.

use std::fmt::Write;
use std::sync::Arc;

use tracing::field::{Field, Visit};
use tracing_subscriber::layer::Context;
use windows_sys::Win32::Foundation::HANDLE;
use windows_sys::Win32::System::EventLog::{
    DeregisterEventSource, RegisterEventSourceW, ReportEventW, EVENTLOG_ERROR_TYPE,
};

/// Longest text one event carries (the Event Log's own limit is 31 839
/// characters).
const MAX_EVENT: usize = 8 << 10;

/// A handle to the Event Log, or nothing if it could not be opened.
#[derive(Clone)]
pub(super) struct EventLog(Option<Arc<Source>>);

struct Source(HANDLE);

// SAFETY: an event source handle may be used from any thread.
unsafe impl Send for Source {}
// SAFETY: ReportEventW on one handle from several threads is allowed.
unsafe impl Sync for Source {}

impl Drop for Source {
    fn drop(&mut self) {
        // SAFETY: a handle RegisterEventSourceW returned, closed once.
        unsafe { DeregisterEventSource(self.0) };
    }
}

impl EventLog {
    pub(super) fn open(name: &str) -> EventLog {
        let wide: Vec<u16> = name.encode_utf16().chain([0]).collect();
        // SAFETY: a NUL-terminated name; a null server is this machine.
        let h = unsafe { RegisterEventSourceW(std::ptr::null(), wide.as_ptr()) };
        EventLog((!h.is_null()).then(|| Arc::new(Source(h))))
    }

    /// Writes `text` as an error event.
    pub(super) fn error(&self, text: &str) {
        let Some(source) = &self.0 else { return };
        let cut: String = text.chars().take(MAX_EVENT).collect();
        let wide: Vec<u16> = cut.encode_utf16().chain([0]).collect();
        let strings = [wide.as_ptr()];
        // SAFETY: one NUL-terminated string, alive for the call; no SID,
        // no raw data.
        unsafe {
            ReportEventW(
                source.0,
                EVENTLOG_ERROR_TYPE,
                0,
                1,
                std::ptr::null_mut(),
                1,
                0,
                strings.as_ptr(),
                std::ptr::null(),
            )
        };
    }

    /// A logging layer that sends each error line here too.
    pub(super) fn layer(self) -> ErrorsToEventLog {
        ErrorsToEventLog(self)
    }
}

pub(super) struct ErrorsToEventLog(EventLog);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for ErrorsToEventLog {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if *event.metadata().level() != tracing::Level::ERROR {
            return;
        }
        let mut text = Text::default();
        event.record(&mut text);
        self.0.error(&text.0);
    }
}

/// An event's message, then its other fields as `name=value`.
#[derive(Default)]
struct Text(String);

impl Visit for Text {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let rest = std::mem::take(&mut self.0);
            let _ = write!(self.0, "{value:?}{rest}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }
}
