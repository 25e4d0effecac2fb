use super::*;
use crate::protocol::headers::{REPLAYED, STRIPE_SHOULD_RETRY};
use http::header::RETRY_AFTER;

#[test]
fn conflict_rounds_retry_after_up() {
    let r = GatewayError::Conflict {
        retry_after: Duration::from_millis(1500),
    }
    .to_response();
    assert_eq!(r.status(), StatusCode::CONFLICT);
    assert_eq!(r.headers()[RETRY_AFTER], "2");
    assert_eq!(r.headers()[CONTENT_TYPE], "application/problem+json");
    let r = GatewayError::Conflict {
        retry_after: Duration::from_millis(10),
    }
    .to_response();
    assert_eq!(r.headers()[RETRY_AFTER], "1");
}

async fn body(r: Response<Body>) -> serde_json::Value {
    use http_body_util::BodyExt;
    let bytes = r.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

fn stripe() -> Dialect {
    Dialect {
        envelope: Envelope::Stripe,
        problem_base_url: None,
    }
}

#[tokio::test]
async fn problem_json_by_default_with_urn_types_or_links() {
    let e = GatewayError::Mismatch;
    let r = e.to_response();
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(r.headers()[CONTENT_TYPE], "application/problem+json");
    let v = body(r).await;
    assert_eq!(
        v["type"],
        "urn:dedupe-gateway:problem:idempotency-key-reused"
    );
    assert_eq!(v["status"], 422);
    assert_eq!(
        v["title"],
        "Idempotency key reused with a different request"
    );
    let linked = Dialect {
        envelope: Envelope::Problem,
        problem_base_url: Some("https://docs.example.com/problems/".into()),
    };
    let v = body(e.to_response_in(&linked)).await;
    assert_eq!(
        v["type"],
        "https://docs.example.com/problems/idempotency-key-reused"
    );
}

#[tokio::test]
async fn stripe_reads_idempotency_errors_at_400_and_says_which_to_retry() {
    let in_flight = GatewayError::Conflict {
        retry_after: Duration::from_millis(2500),
    };
    let r = in_flight.to_response_in(&stripe());
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(r.headers()[CONTENT_TYPE], "application/json");
    assert_eq!(r.headers()[RETRY_AFTER], "3");
    assert_eq!(r.headers()[&STRIPE_SHOULD_RETRY], "true");
    let v = body(r).await;
    assert_eq!(v["error"]["type"], "idempotency_error");
    assert_eq!(v["error"]["code"], "idempotency_key_in_use");
    assert_eq!(
        v["error"]["message"],
        "A request with this idempotency key is still in flight"
    );
    assert!(v["error"].get("doc_url").is_none(), "{v}");
    assert_eq!(in_flight.status_in(&stripe()), StatusCode::BAD_REQUEST);
    assert_eq!(
        in_flight.status_in(&Dialect::default()),
        StatusCode::CONFLICT
    );

    for (e, code) in [
        (GatewayError::Mismatch, "idempotency_key_reused"),
        (GatewayError::OutcomeUnknown, "outcome_unknown"),
    ] {
        let r = e.to_response_in(&stripe());
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        assert_eq!(r.headers()[&STRIPE_SHOULD_RETRY], "false");
        let v = body(r).await;
        assert_eq!(v["error"]["type"], "idempotency_error");
        assert_eq!(v["error"]["code"], code);
    }
}

#[tokio::test]
async fn stripe_keeps_other_statuses_and_headers_typed_by_class() {
    let r = GatewayError::StoreUnavailable.to_response_in(&stripe());
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.headers()[RETRY_AFTER], "1");
    assert!(!r.headers().contains_key(&STRIPE_SHOULD_RETRY));
    let v = body(r).await;
    assert_eq!(v["error"]["type"], "api_error");
    assert_eq!(v["error"]["code"], "store_unavailable");

    let missing = GatewayError::Key(KeyError::MissingPart("json:/order_id".into()));
    let linked = Dialect {
        problem_base_url: Some("https://docs.example.com/p/".into()),
        ..stripe()
    };
    let r = missing.to_response_in(&linked);
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let v = body(r).await;
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(v["error"]["code"], "fingerprint_part_missing");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("Request lacks a fingerprint part: ")
            && message.contains("json:/order_id"),
        "{message}"
    );
    assert_eq!(
        v["error"]["doc_url"],
        "https://docs.example.com/p/fingerprint-part-missing"
    );

    // A record without its body keeps the original status and its replay mark.
    let gone = GatewayError::ReplayUnavailable {
        status: StatusCode::CREATED,
        body: StoredBody::NotStored,
    };
    let r = gone.to_response_in(&stripe());
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(r.headers()[&REPLAYED], "true");
}

#[tokio::test]
async fn a_template_is_filled_with_the_answer_and_keeps_status_and_headers() {
    let template = crate::protocol::route::dialect::Template::new(
        r#"{"errors": [{"status": "{{status}}", "code": "{{name}}", "type": "{{type}}", "title": "{{title}}", "detail": "{{detail}}"}]}"#,
        "application/vnd.api+json",
    )
    .unwrap();
    let dialect = Dialect {
        envelope: Envelope::Template(std::sync::Arc::new(template)),
        problem_base_url: None,
    };
    let e = GatewayError::Conflict {
        retry_after: Duration::from_secs(4),
    };
    let r = e.to_response_in(&dialect);
    assert_eq!(r.status(), StatusCode::CONFLICT);
    assert_eq!(r.headers()[CONTENT_TYPE], "application/vnd.api+json");
    assert_eq!(r.headers()[RETRY_AFTER], "4");
    let v = body(r).await;
    let err = &v["errors"][0];
    assert_eq!(err["status"], "409");
    assert_eq!(err["code"], "request-in-flight");
    assert_eq!(err["type"], "urn:dedupe-gateway:problem:request-in-flight");
    assert_eq!(err["detail"], "");
    let e = GatewayError::Key(KeyError::MissingPart("header:\"X\"".into()));
    let v = body(e.to_response_in(&dialect)).await;
    assert!(
        v["errors"][0]["detail"]
            .as_str()
            .unwrap()
            .contains("header:\"X\""),
        "{v}"
    );
}

#[test]
fn key_errors_name_the_part_to_the_client() {
    let e = GatewayError::Key(KeyError::MissingPart("json:/order_id".into()));
    assert_eq!(e.status(), StatusCode::BAD_REQUEST);
    assert!(e.detail().unwrap().contains("json:/order_id"));
    let broken = UpstreamFailure::Broken("connection reset by peer".into());
    assert!(GatewayError::from(broken).detail().is_none());
}

#[tokio::test]
async fn the_grpc_dialect_answers_trailers_only_with_a_code_and_a_readable_message() {
    use http_body_util::BodyExt;
    let grpc = Dialect {
        envelope: Envelope::Grpc,
        problem_base_url: None,
    };
    let in_flight = GatewayError::Conflict {
        retry_after: Duration::from_millis(1500),
    };
    let r = in_flight.to_response_in(&grpc);
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(in_flight.status_in(&grpc), StatusCode::OK);
    assert_eq!(r.headers()[CONTENT_TYPE], "application/grpc");
    assert_eq!(r.headers()["grpc-status"], "10");
    assert_eq!(r.headers()[RETRY_AFTER], "2");
    assert_eq!(r.headers()["grpc-retry-pushback-ms"], "1500");
    let message = r.headers()["grpc-message"].to_str().unwrap().to_owned();
    assert!(
        message.contains("in flight (request-in-flight)"),
        "{message}"
    );
    assert!(r.into_body().collect().await.unwrap().to_bytes().is_empty());
    for (e, code) in [
        (GatewayError::Mismatch, 9),
        (GatewayError::OutcomeUnknown, 10),
        (GatewayError::StoreUnavailable, 14),
        (GatewayError::BodyTooLarge { limit: 1 }, 8),
        (
            GatewayError::Upstream(UpstreamFailure::Timeout(Duration::from_secs(1))),
            4,
        ),
        (GatewayError::Key(KeyError::Grpc(FrameError::Several(2))), 3),
    ] {
        let r = e.to_response_in(&grpc);
        assert_eq!(r.headers()["grpc-status"], code.to_string(), "{e:?}");
    }
    // The hold is named.
    let held = GatewayError::OutcomeUnknown.to_response_in(&grpc);
    let message = held.headers()["grpc-message"].to_str().unwrap();
    assert!(message.contains("on_unknown = \"hold\""), "{message}");
}
