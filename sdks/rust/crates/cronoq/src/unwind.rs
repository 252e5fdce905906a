//! Containing panics: of an executor (its task fails, the scheduler goes on) and of the driver
//! (the scheduler stops with an internal error instead of hanging its callers).

use std::any::Any;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::task::{Context, Poll};

/// A future that resolves to `Err(panic text)` when polling the inner one panics.
pub(crate) struct CatchUnwind<F>(pub(crate) F);

impl<F: Future + Unpin> Future for CatchUnwind<F> {
    type Output = Result<F::Output, String>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = &mut self.0;
        match catch_unwind(AssertUnwindSafe(|| Pin::new(inner).poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(out)) => Poll::Ready(Ok(out)),
            Err(payload) => Poll::Ready(Err(panic_text(payload.as_ref()))),
        }
    }
}

/// The text of a panic: its message when it is a string, else empty.
pub(crate) fn panic_text(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        String::new()
    }
}

/// The failure message of a panic: `panic: <text>`, or `panic` when it has no text.
pub(crate) fn panic_message(text: &str) -> String {
    if text.is_empty() {
        "panic".to_string()
    } else {
        format!("panic: {text}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn panics_become_their_text() {
        let ok = CatchUnwind(Box::pin(async { 5 })).await;
        assert_eq!(ok, Ok(5));
        let boom: Result<(), String> = CatchUnwind(Box::pin(async { panic!("boom {}", 1) })).await;
        assert_eq!(boom, Err("boom 1".to_string()));
        let any = catch_unwind(|| std::panic::panic_any(7u8)).unwrap_err();
        assert_eq!(panic_message(&panic_text(any.as_ref())), "panic");
        assert_eq!(panic_message("x"), "panic: x");
    }
}
