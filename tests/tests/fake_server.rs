//! The fake LLM server, driven through a real HTTP client (reqwest blocking) over loopback.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use promptgen_tests::{ArgsShape, FakeCall, FakeLlm, Identity, Moment, Reply, Turn, refused_url};
use reqwest::blocking::{Client, Response};
use serde_json::{Value, json};

/// With codegen-core's `tls` feature in the build, reqwest is built with rustls and no
/// crypto provider of its own (see BENCHMARKS.md, cold build): a client needs one installed.
fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn client() -> Client {
    install_crypto_provider();
    Client::builder().timeout(Duration::from_secs(10)).build().expect("client")
}

fn post(client: &Client, url: &str, body: &Value) -> Response {
    client.post(url).json(body).send().expect("request")
}

fn chat_body(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": false})
}

/// Sends raw bytes on a fresh connection, half-closes it, and returns everything the server sends until it
/// closes (or 5 s pass, which fails the caller's assertions rather than hanging).
fn raw_exchange(server: &FakeLlm, request: &[u8]) -> String {
    let addr = server.url().trim_start_matches("http://").to_owned();
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    stream.write_all(request).unwrap();
    // Half-close: a server waiting for more of the request sees EOF instead of waiting.
    stream.shutdown(std::net::Shutdown::Write).unwrap();
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

// ----------------------------------------------------------------------------------------------
// Turns
// ----------------------------------------------------------------------------------------------

#[test]
fn text_turn_in_ollama_shape() {
    let server = FakeLlm::start(vec![Reply::turn(Turn::text("hello").tokens(42, 7))]);
    let response = post(&client(), &format!("{}/api/chat", server.url()), &chat_body("qwen"));
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"].to_str().unwrap(), "application/json");
    let body: Value = response.json().unwrap();
    assert_eq!(
        body,
        json!({
            "model": "qwen",
            "created_at": "2026-01-01T00:00:00Z",
            "message": {"role": "assistant", "content": "hello"},
            "done": true,
            "done_reason": "stop",
            "total_duration": 1000,
            "load_duration": 10,
            "prompt_eval_count": 42,
            "eval_count": 7
        })
    );
    assert_eq!(server.remaining(), 0);
}

#[test]
fn tool_calls_in_ollama_shape_with_every_args_shape() {
    let args = json!({"path": "a.rs", "content": "fn main() {}"});
    let server = FakeLlm::start(vec![Reply::turn(Turn::calls(vec![
        FakeCall::new("write_file", args.clone()).id("call_ab12cd34"),
        FakeCall::new("read_file", json!({"path": "b.rs"})),
        FakeCall::new("list", json!({"dir": "."})).shape(ArgsShape::Object),
        FakeCall::new("write_file", args.clone()).shape(ArgsShape::String),
        FakeCall::new("finish", json!({})).shape(ArgsShape::RawString("{oops".into())),
    ]))]);
    let body: Value = post(&client(), &format!("{}/api/chat", server.url()), &chat_body("llama3.1")).json().unwrap();
    assert_eq!(
        body["message"],
        json!({
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "call_ab12cd34", "function": {"index": 0, "name": "write_file", "arguments": args}},
                {"function": {"index": 1, "name": "read_file", "arguments": {"path": "b.rs"}}},
                {"function": {"index": 2, "name": "list", "arguments": {"dir": "."}}},
                {"function": {"index": 3, "name": "write_file", "arguments": args.to_string()}},
                {"function": {"index": 4, "name": "finish", "arguments": "{oops"}}
            ]
        })
    );
    // No id key at all when none was given (newer servers only), and done_reason never
    // "tool_calls" in Ollama.
    assert!(body["message"]["tool_calls"][1].get("id").is_none());
    assert_eq!(body["done_reason"], "stop");
    assert_eq!(body["model"], "llama3.1");
    assert_eq!(body["prompt_eval_count"], 10);
    assert_eq!(body["eval_count"], 5);
}

#[test]
fn text_turn_in_openai_shape() {
    let server = FakeLlm::start(vec![Reply::turn(Turn::text("hello").tokens(3, 4))]);
    let body: Value =
        post(&client(), &format!("{}/v1/chat/completions", server.url()), &chat_body("gpt-x")).json().unwrap();
    assert_eq!(
        body,
        json!({
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 0,
            "model": "gpt-x",
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": "hello"},
                "finish_reason": "stop"
            }],
            "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
        })
    );
}

#[test]
fn tool_calls_in_openai_shape_with_every_args_shape_and_generated_ids() {
    let args = json!({"path": "a.rs", "content": "x"});
    let server = FakeLlm::start(vec![
        Reply::turn(Turn::calls(vec![
            FakeCall::new("write_file", args.clone()),
            FakeCall::new("write_file", args.clone()).id("mine"),
            FakeCall::new("list", json!({"dir": "."})).shape(ArgsShape::Object),
            FakeCall::new("finish", json!({"ignored": 1})).shape(ArgsShape::RawString(String::new())),
            FakeCall::new("read_file", json!({"path": "b"})).shape(ArgsShape::String),
        ])),
        Reply::turn(Turn::call("read_file", json!({"path": "c"})).with_content("reading")),
    ]);
    let url = format!("{}/chat/completions", server.url());
    let client = client();
    let body: Value = post(&client, &url, &chat_body("m")).json().unwrap();
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["content"], Value::Null);
    assert!(choice["message"].as_object().unwrap().contains_key("content"));
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(
        calls[0],
        json!({"id": "call_1", "type": "function",
               "function": {"name": "write_file", "arguments": args.to_string()}})
    );
    // The default OpenAI shape is JSON text that round-trips to the arguments.
    let text = calls[0]["function"]["arguments"].as_str().unwrap();
    assert_eq!(serde_json::from_str::<Value>(text).unwrap(), args);
    assert_eq!(calls[1]["id"], "mine");
    assert_eq!(calls[2]["id"], "call_2");
    assert_eq!(calls[2]["function"]["arguments"], json!({"dir": "."}));
    assert_eq!(calls[3]["id"], "call_3");
    assert_eq!(calls[3]["function"]["arguments"], "");
    assert_eq!(calls[4]["id"], "call_4");
    assert_eq!(calls[4]["function"]["arguments"], r#"{"path":"b"}"#);
    assert_eq!(body["usage"], json!({"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}));

    // Generated ids stay unique across turns.
    let body: Value = post(&client, &url, &chat_body("m")).json().unwrap();
    let message = &body["choices"][0]["message"];
    assert_eq!(message["content"], "reading");
    assert_eq!(message["tool_calls"][0]["id"], "call_5");
}

#[test]
fn turn_protocol_follows_the_request_path() {
    let server =
        FakeLlm::start(vec![Reply::turn(Turn::text("a")), Reply::turn(Turn::text("b")), Reply::turn(Turn::text("c"))]);
    let client = client();
    // A host with a path prefix still speaks Ollama.
    let ollama: Value = post(&client, &format!("{}/proxy/api/chat", server.url()), &chat_body("m")).json().unwrap();
    assert_eq!(ollama["message"]["content"], "a");
    assert!(ollama.get("choices").is_none());

    // No model in the request: a placeholder model is echoed.
    let openai: Value = post(&client, &format!("{}/v1/chat/completions", server.url()), &json!({})).json().unwrap();
    assert_eq!(openai["choices"][0]["message"]["content"], "b");
    assert_eq!(openai["model"], "fake-model");

    // A turn cannot be rendered for a non-chat path: 404, the reply is consumed.
    let response = post(&client, &format!("{}/v1/completions", server.url()), &chat_body("m"));
    assert_eq!(response.status(), 404);
    let body: Value = response.json().unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("/v1/completions is not a chat endpoint"), "{message}");
    assert_eq!(server.remaining(), 0);
}

// ----------------------------------------------------------------------------------------------
// Verbatim replies and errors
// ----------------------------------------------------------------------------------------------

#[test]
fn json_and_status_replies_are_verbatim_with_headers() {
    let server = FakeLlm::start(vec![
        Reply::json(json!({"anything": [1, 2, 3]})),
        Reply::status(429, json!({"error": "slow down"})).header("Retry-After", "2").header("retry-after-ms", "1500"),
        Reply::status(200, json!("plain")).header("Content-Type", "text/plain"),
    ]);
    let client = client();
    let url = format!("{}/whatever", server.url());

    let response = post(&client, &url, &json!({}));
    assert_eq!(response.status(), 200);
    assert_eq!(response.json::<Value>().unwrap(), json!({"anything": [1, 2, 3]}));

    let response = post(&client, &url, &json!({}));
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()["retry-after"], "2");
    assert_eq!(response.headers()["retry-after-ms"], "1500");
    assert_eq!(response.json::<Value>().unwrap(), json!({"error": "slow down"}));

    let response = post(&client, &url, &json!({}));
    let content_types: Vec<_> = response.headers().get_all("content-type").iter().collect();
    assert_eq!(content_types, ["text/plain"]);
    assert_eq!(response.text().unwrap(), r#""plain""#);
}

#[test]
fn errors_are_rendered_in_the_request_protocol() {
    let server = FakeLlm::start(vec![
        Reply::error(404, "model 'x' not found"),
        Reply::error(500, "boom"),
        Reply::error(400, "bad tools"),
        Reply::openai_error(429, "quota", "insufficient_quota", Some("insufficient_quota")).header("Retry-After", "1"),
        Reply::openai_error(429, "quota", "insufficient_quota", Some("insufficient_quota")),
    ]);
    let client = client();
    let ollama = format!("{}/api/chat", server.url());
    let openai = format!("{}/v1/chat/completions", server.url());

    let response = post(&client, &ollama, &chat_body("x"));
    assert_eq!(response.status(), 404);
    assert_eq!(response.json::<Value>().unwrap(), json!({"error": "model 'x' not found"}));

    let response = post(&client, &openai, &chat_body("x"));
    assert_eq!(response.status(), 500);
    assert_eq!(
        response.json::<Value>().unwrap(),
        json!({"error": {"message": "boom", "type": "server_error", "param": null, "code": null}})
    );

    let response = post(&client, &openai, &chat_body("x"));
    assert_eq!(response.status(), 400);
    assert_eq!(response.json::<Value>().unwrap()["error"]["type"], "invalid_request_error");

    let response = post(&client, &openai, &chat_body("x"));
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()["retry-after"], "1");
    assert_eq!(
        response.json::<Value>().unwrap(),
        json!({"error": {"message": "quota", "type": "insufficient_quota", "param": null,
                         "code": "insufficient_quota"}})
    );

    // The explicit OpenAI fields do not leak into the Ollama shape.
    let response = post(&client, &ollama, &chat_body("x"));
    assert_eq!(response.status(), 429);
    assert_eq!(response.json::<Value>().unwrap(), json!({"error": "quota"}));
}

#[test]
fn exhausted_script_answers_500_in_the_request_protocol_and_records() {
    let server = FakeLlm::start(vec![Reply::turn(Turn::text("only"))]);
    let client = client();
    let openai = format!("{}/v1/chat/completions", server.url());
    assert_eq!(post(&client, &openai, &chat_body("m")).status(), 200);

    let response = post(&client, &openai, &chat_body("m"));
    assert_eq!(response.status(), 500);
    let body: Value = response.json().unwrap();
    assert_eq!(body["error"]["message"], "fake LLM server: script exhausted after 1 replies");

    let response = post(&client, &format!("{}/api/chat", server.url()), &chat_body("m"));
    assert_eq!(response.status(), 500);
    assert_eq!(
        response.json::<Value>().unwrap(),
        json!({"error": "fake LLM server: script exhausted after 1 replies"})
    );

    let paths: Vec<_> = server.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(paths, ["/v1/chat/completions", "/v1/chat/completions", "/api/chat"]);

    // Pushing revives the script.
    server.push(Reply::json(json!({"late": true})));
    assert_eq!(server.remaining(), 1);
    let body: Value = post(&client, &openai, &json!({})).json().unwrap();
    assert_eq!(body, json!({"late": true}));
    assert_eq!(server.remaining(), 0);
}

#[test]
fn discovery_endpoints_do_not_consume_the_script() {
    let server = FakeLlm::start(vec![Reply::json(json!({"scripted": 1}))]);
    let client = client();
    let version: Value = client.get(format!("{}/api/version", server.url())).send().unwrap().json().unwrap();
    assert_eq!(version, json!({"version": "0.0.0-fake"}));
    let health = client.get(format!("{}/health", server.url())).send().unwrap();
    assert_eq!(health.status(), 200);
    assert_eq!(health.json::<Value>().unwrap(), json!({"status": "ok"}));
    assert_eq!(server.remaining(), 1);

    // A POST to /health is not discovery: it takes the scripted reply.
    let body: Value = client.post(format!("{}/health", server.url())).send().unwrap().json().unwrap();
    assert_eq!(body, json!({"scripted": 1}));

    let asked: Vec<_> = server.discovery().into_iter().map(|r| (r.method, r.path)).collect();
    assert_eq!(asked, [("GET".to_owned(), "/api/version".to_owned()), ("GET".to_owned(), "/health".to_owned())]);
    let seen: Vec<_> = server.requests().into_iter().map(|r| (r.method, r.path)).collect();
    assert_eq!(seen, [("POST".to_owned(), "/health".to_owned())]);
}

#[test]
fn the_model_list_says_which_server_it_is() {
    let server = FakeLlm::start(Vec::new());
    let client = client();
    let models = format!("{}/v1/models", server.url());
    assert_eq!(client.get(&models).send().unwrap().status(), 404, "anonymous by default");
    for (identity, owner) in [
        (Identity::LlamaServer, "llamacpp"),
        (Identity::LlamaCppPython, "me"),
        (Identity::Vllm, "vllm"),
        (Identity::Ollama("0.6.2".into()), "library"),
    ] {
        server.identify_as(identity);
        let list: Value = client.get(&models).send().unwrap().json().unwrap();
        assert_eq!(list["data"][0]["owned_by"], owner, "{list}");
    }
    let version: Value = client.get(format!("{}/api/version", server.url())).send().unwrap().json().unwrap();
    assert_eq!(version, json!({"version": "0.6.2"}));
    assert_eq!(server.discovery().len(), 6);
    assert!(server.requests().is_empty());
}

// ----------------------------------------------------------------------------------------------
// Misbehaviour
// ----------------------------------------------------------------------------------------------

#[test]
fn stall_is_a_client_timeout_and_drop_ends_it() {
    let started = Instant::now();
    let server = FakeLlm::start(vec![
        Reply::stall(Duration::from_secs(5)),
        Reply::json(json!({"after": "stall"})),
        Reply::stall(Duration::from_secs(30)),
    ]);
    install_crypto_provider();
    let impatient = Client::builder().timeout(Duration::from_millis(300)).build().unwrap();
    let url = format!("{}/api/chat", server.url());
    let err = impatient.post(&url).json(&chat_body("m")).send().expect_err("a stall must time out");
    assert!(err.is_timeout(), "{err:?}");
    // Recorded before the (non-)answer.
    assert_eq!(server.requests().len(), 1);
    assert_eq!(server.requests()[0].json()["model"], "m");

    // The server keeps serving other requests meanwhile.
    let body: Value = post(&impatient, &url, &json!({})).json().unwrap();
    assert_eq!(body, json!({"after": "stall"}));

    // A 30 s stall on a raw connection: dropping the server must close it promptly.
    let addr = server.url().trim_start_matches("http://").to_owned();
    let mut raw = TcpStream::connect(addr).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    raw.write_all(b"POST /api/chat HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}").unwrap();
    while server.requests().len() < 3 {
        assert!(started.elapsed() < Duration::from_secs(5), "stall request never arrived");
        std::thread::sleep(Duration::from_millis(5));
    }
    let dropping = Instant::now();
    drop(server);
    let mut buf = [0u8; 64];
    let n = raw.read(&mut buf).expect("EOF, not a read timeout");
    assert_eq!(n, 0, "a stall sends nothing");
    assert!(dropping.elapsed() < Duration::from_secs(2), "{:?}", dropping.elapsed());
    assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
}

#[test]
fn truncated_body_fails_when_read() {
    let full = json!({"message": {"role": "assistant", "content": "a fairly long reply body"}});
    let server =
        FakeLlm::start(vec![Reply::truncated(full.clone()).header("X-Fake", "yes"), Reply::json(json!({"next": 1}))]);
    let client = client();
    let url = format!("{}/api/chat", server.url());
    let response = post(&client, &url, &chat_body("m"));
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-fake"], "yes");
    assert_eq!(response.content_length(), Some(full.to_string().len() as u64));
    let err = response.text().expect_err("half a body must not read cleanly");
    assert!(err.is_body() || err.is_decode(), "{err:?}");

    // The same client recovers on a new connection.
    let body: Value = post(&client, &url, &json!({})).json().unwrap();
    assert_eq!(body, json!({"next": 1}));
    assert_eq!(server.connections(), 2);
}

#[test]
fn truncated_body_is_the_first_half_on_the_wire() {
    let full = json!({"k": "0123456789abcdef"});
    let text = full.to_string();
    let server = FakeLlm::start(vec![Reply::truncated(full)]);
    let out = raw_exchange(&server, b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n");
    let (head, body) = out.split_once("\r\n\r\n").expect("a response head");
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(head.contains(&format!("Content-Length: {}", text.len())), "{head}");
    assert_eq!(body, &text[..text.len() / 2]);
}

#[test]
fn hang_up_is_a_request_error() {
    let server = FakeLlm::start(vec![Reply::hang_up(), Reply::json(json!({"ok": true}))]);
    let client = client();
    let url = format!("{}/v1/chat/completions", server.url());
    let err = client.post(&url).json(&chat_body("m")).send().expect_err("no response must be an error");
    assert!(err.is_request(), "{err:?}");
    assert!(!err.is_timeout(), "{err:?}");
    assert!(!err.is_connect(), "{err:?}");
    // Not retried behind our back: exactly one request reached the server.
    assert_eq!(server.requests().len(), 1);
    assert_eq!(server.remaining(), 1);

    let body: Value = post(&client, &url, &json!({})).json().unwrap();
    assert_eq!(body, json!({"ok": true}));
}

#[test]
fn refused_url_is_a_connect_error() {
    let url = refused_url();
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    assert!(!url.ends_with('/'));
    let err = client().post(format!("{url}/api/chat")).json(&chat_body("m")).send().expect_err("nothing listens");
    assert!(err.is_connect(), "{err:?}");
}

// ----------------------------------------------------------------------------------------------
// HTTP plumbing
// ----------------------------------------------------------------------------------------------

#[test]
fn keep_alive_serves_several_requests_on_one_connection_in_order() {
    let server = FakeLlm::start(vec![
        Reply::turn(Turn::text("one")),
        Reply::turn(Turn::text("two")),
        Reply::turn(Turn::text("three")),
    ]);
    let url = server.url();
    assert!(url.starts_with("http://127.0.0.1:") && !url.ends_with('/'), "{url}");
    let client = client();
    let mut contents = Vec::new();
    for i in 0..3 {
        let body: Value = client
            .post(format!("{url}/api/chat"))
            .header("Authorization", "Bearer k")
            .json(&json!({"model": "m", "turn": i}))
            .send()
            .unwrap()
            .json()
            .unwrap();
        contents.push(body["message"]["content"].as_str().unwrap().to_owned());
    }
    assert_eq!(contents, ["one", "two", "three"]);
    assert_eq!(server.connections(), 1, "the client's pooled connection was reused");

    let requests = server.requests();
    assert_eq!(requests.len(), 3);
    for (i, request) in requests.iter().enumerate() {
        assert_eq!(request.method, "POST");
        assert_eq!(request.path, "/api/chat");
        assert_eq!(request.json(), json!({"model": "m", "turn": i}));
        assert_eq!(request.header("AUTHORIZATION"), Some("Bearer k"));
        assert_eq!(request.header("content-type"), Some("application/json"));
        assert!(request.headers.iter().all(|(n, _)| *n == n.to_lowercase()));
    }
    assert_eq!(requests[0].header("x-missing"), None);
}

#[test]
fn chunked_request_body_from_reqwest_is_decoded() {
    let server = FakeLlm::start(vec![Reply::json(json!({})), Reply::json(json!({}))]);
    let client = client();
    let payload = json!({"model": "m", "messages": [{"role": "user", "content": "x".repeat(20_000)}]});
    // A reader of unknown length makes reqwest send `Transfer-Encoding: chunked`.
    let body = reqwest::blocking::Body::new(std::io::Cursor::new(payload.to_string().into_bytes()));
    let response = client
        .post(format!("{}/api/chat", server.url()))
        .header("Content-Type", "application/json")
        .body(body)
        .send()
        .unwrap();
    assert_eq!(response.status(), 200);
    let _ = response.text().unwrap();
    // And the connection is still in sync for the next request.
    assert_eq!(post(&client, &format!("{}/api/chat", server.url()), &json!({"n": 2})).status(), 200);

    let requests = server.requests();
    assert_eq!(requests[0].header("transfer-encoding"), Some("chunked"));
    assert_eq!(requests[0].header("content-length"), None);
    assert_eq!(requests[0].json(), payload);
    assert_eq!(requests[1].json(), json!({"n": 2}));
    assert_eq!(server.connections(), 1);
}

#[test]
fn raw_chunked_body_with_extensions_and_trailers_then_pipelined_request() {
    let server = FakeLlm::start(vec![Reply::json(json!({"a": 1})), Reply::json(json!({"b": 2}))]);
    let out = raw_exchange(
        &server,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
          5;ext=1\r\n{\"k\":\r\nA\r\n \"0123456\"\r\n1\r\n}\r\n0\r\nX-Trailer: t\r\n\r\n\
          POST /second HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n[]",
    );
    assert_eq!(out.matches("HTTP/1.1 200 OK\r\n").count(), 2, "{out}");
    assert!(out.ends_with(r#"{"b":2}"#), "{out}");
    assert!(out.contains("Connection: close"), "{out}");
    let requests = server.requests();
    assert_eq!(requests[0].body, r#"{"k": "0123456"}"#);
    assert_eq!(requests[0].json(), json!({"k": "0123456"}));
    assert_eq!(requests[1].path, "/second");
    assert_eq!(requests[1].body, "[]");
}

#[test]
fn malformed_request_gets_400_and_the_server_survives() {
    let server = FakeLlm::start(vec![Reply::json(json!({"still": "alive"}))]);
    let out = raw_exchange(&server, b"this is not http\r\n\r\n");
    assert!(out.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{out}");
    assert!(out.contains("malformed request"), "{out}");
    let out = raw_exchange(&server, b"POST /x HTTP/1.1\r\nContent-Length: nope\r\n\r\n");
    assert!(out.starts_with("HTTP/1.1 400 "), "{out}");
    // Client vanishing mid-body.
    let _ = raw_exchange(&server, b"POST /x HTTP/1.1\r\nContent-Length: 100\r\n\r\n{");

    assert!(server.requests().is_empty(), "malformed requests are not recorded");
    assert_eq!(server.remaining(), 1);
    let body: Value = post(&client(), &format!("{}/x", server.url()), &json!({})).json().unwrap();
    assert_eq!(body, json!({"still": "alive"}));
}

#[test]
#[should_panic(expected = "is not JSON")]
fn recorded_json_panics_clearly_on_non_json() {
    let server = FakeLlm::start(vec![Reply::json(json!({}))]);
    client().post(format!("{}/api/chat", server.url())).body("not json").send().unwrap();
    server.requests()[0].json();
}

// ----------------------------------------------------------------------------------------------
// Streams
// ----------------------------------------------------------------------------------------------

fn streamed_body(model: &str, usage: bool) -> Value {
    let mut body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": true});
    if usage {
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

/// The SSE events of a body, without the `data: ` prefix.
fn events(body: &str) -> Vec<String> {
    assert!(body.ends_with("\n\n"), "every event ends with a blank line: {body:?}");
    body.split("\n\n").filter(|e| !e.is_empty()).map(|e| e.strip_prefix("data: ").unwrap().to_owned()).collect()
}

#[test]
fn an_openai_stream_has_the_text_and_a_tool_call_in_pieces_then_usage_and_done() {
    let args = json!({"path": "a.rs", "content": "fn a() {}"});
    let turn = Turn::calls(vec![FakeCall::new("write_file", args.clone())]).with_content("Writing it.").tokens(12, 9);
    let server = FakeLlm::start(vec![Reply::turn(turn.clone()).in_pieces(5), Reply::turn(turn)]);
    let url = format!("{}/v1/chat/completions", server.url());
    let response = post(&client(), &url, &streamed_body("m", true));
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    assert_eq!(response.headers()["transfer-encoding"], "chunked");
    let events = events(&response.text().unwrap());
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    assert_eq!(chunks[0]["choices"][0]["delta"], json!({"role": "assistant", "content": null}));
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(text, "Writing it.");
    let fragments: Vec<&Value> = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["tool_calls"].get(0)).collect();
    assert_eq!(
        fragments[0],
        &json!({"index": 0, "id": "call_1", "type": "function", "function": {"name": "write_file", "arguments": ""}})
    );
    assert!(fragments.len() > 3, "the arguments arrive in pieces: {fragments:?}");
    assert!(
        fragments[1..].iter().all(|f| f["index"] == 0 && f.get("id").is_none() && f["function"].get("name").is_none())
    );
    let arguments: String = fragments.iter().map(|f| f["function"]["arguments"].as_str().unwrap()).collect();
    assert_eq!(serde_json::from_str::<Value>(&arguments).unwrap(), args);
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "tool_calls");
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"], json!({"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21}));

    // Without `stream_options.include_usage`, no token counts (as OpenAI).
    let events = events_of(post(&client(), &url, &streamed_body("m", false)));
    assert!(events.iter().all(|e| !e.contains("\"usage\"")), "{events:?}");
}

fn events_of(response: Response) -> Vec<String> {
    events(&response.text().unwrap())
}

#[test]
fn an_ollama_stream_is_ndjson_with_each_tool_call_whole_and_the_counts_last() {
    let turn = Turn::calls(vec![
        FakeCall::new("read_file", json!({"path": "a.rs"})).id("c1"),
        FakeCall::new("finish", json!({})),
    ])
    .with_content("héllo wörld")
    .tokens(30, 4);
    let server = FakeLlm::start(vec![Reply::turn(turn).in_pieces(3)]);
    let response = post(&client(), &format!("{}/api/chat", server.url()), &streamed_body("qwen", false));
    assert_eq!(response.headers()["content-type"], "application/x-ndjson");
    let body = response.text().unwrap();
    let lines: Vec<Value> = body.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let text: String = lines.iter().map(|l| l["message"]["content"].as_str().unwrap()).collect();
    assert_eq!(text, "héllo wörld");
    assert_eq!(lines[0]["message"]["content"], "hél");
    let calls: Vec<&Value> = lines.iter().filter_map(|l| l["message"]["tool_calls"].get(0)).collect();
    assert_eq!(calls.len(), 2, "one whole call per line");
    assert_eq!(calls[0]["function"]["arguments"], json!({"path": "a.rs"}));
    assert_eq!(calls[0]["id"], "c1");
    let last = lines.last().unwrap();
    assert_eq!(
        (last["done"].clone(), last["prompt_eval_count"].clone(), last["eval_count"].clone()),
        (json!(true), json!(30), json!(4))
    );
    assert!(lines[..lines.len() - 1].iter().all(|l| l["done"] == false));
}

#[test]
fn a_stream_can_be_cut_end_in_an_error_or_be_empty() {
    let turn = Turn::text("abcdefgh");
    let server = FakeLlm::start(vec![
        Reply::turn(turn.clone()).in_pieces(2).cut_after(2),
        Reply::turn(turn.clone()).in_pieces(2).error_after(1, "model crashed"),
        Reply::turn(turn.clone()).error_after(0, "out of memory"),
        Reply::empty_stream(),
    ]);
    let ollama = format!("{}/api/chat", server.url());
    let openai = format!("{}/v1/chat/completions", server.url());
    let cut = post(&client(), &ollama, &streamed_body("m", false)).text().unwrap();
    assert_eq!(cut.lines().count(), 2, "{cut}");
    assert!(!cut.contains("\"done\":true"), "{cut}");
    let error = post(&client(), &ollama, &streamed_body("m", false)).text().unwrap();
    assert_eq!(error.lines().last().unwrap(), r#"{"error":"model crashed"}"#);
    let events = events_of(post(&client(), &openai, &streamed_body("m", true)));
    assert_eq!(events.len(), 1);
    assert_eq!(serde_json::from_str::<Value>(&events[0]).unwrap()["error"]["message"], "out of memory");
    let empty = post(&client(), &openai, &streamed_body("m", true));
    assert_eq!((empty.status().as_u16(), empty.text().unwrap()), (200, String::new()));
}

#[test]
fn a_stream_that_hangs_up_or_stalls_breaks_off_and_a_delay_spaces_its_chunks() {
    let turn = Turn::text("abcdefgh");
    let server = FakeLlm::start(vec![
        Reply::turn(turn.clone()).in_pieces(2).hang_up_after(2),
        Reply::turn(turn.clone()).in_pieces(2).stall_after(1, Duration::from_millis(300)),
        Reply::turn(turn).in_pieces(4).every(Duration::from_millis(100)),
    ]);
    let url = format!("{}/api/chat", server.url());
    let hung = post(&client(), &url, &streamed_body("m", false));
    let mut body = Vec::new();
    assert!(hung.take(1 << 20).read_to_end(&mut body).is_err(), "the body breaks off");
    assert_eq!(String::from_utf8_lossy(&body).lines().count(), 2);

    let stalled = post(&client(), &url, &streamed_body("m", false));
    let mut body = Vec::new();
    assert!(stalled.take(1 << 20).read_to_end(&mut body).is_err(), "the connection closes after the stall");
    assert_eq!(String::from_utf8_lossy(&body).lines().count(), 1);

    let started = Instant::now();
    let slow = post(&client(), &url, &streamed_body("m", false)).text().unwrap();
    assert_eq!(slow.lines().count(), 3, "two pieces and the last line: {slow}");
    assert!(started.elapsed() >= Duration::from_millis(200), "two delays of 100 ms");
    assert_eq!(server.requests().len(), 3, "every request is recorded");
}

#[test]
fn raw_streams_are_sent_verbatim_and_non_streamed_requests_still_get_whole_replies() {
    let server = FakeLlm::start(vec![
        Reply::raw_stream(&["data: {\"choices\":[]}\n\n", "", "error: {\"message\":\"boom\"}\n\n"]),
        Reply::turn(Turn::text("whole")).in_pieces(1).every(Duration::from_secs(30)),
    ]);
    let url = format!("{}/v1/chat/completions", server.url());
    let raw = post(&client(), &url, &chat_body("m"));
    assert_eq!(raw.headers()["content-type"], "text/event-stream");
    assert_eq!(raw.text().unwrap(), "data: {\"choices\":[]}\n\nerror: {\"message\":\"boom\"}\n\n");
    let whole: Value = post(&client(), &url, &chat_body("m")).json().unwrap();
    assert_eq!(whole["choices"][0]["message"]["content"], "whole");
}

// ----------------------------------------------------------------------------------------------
// Routes, waiting for another request, latency, the timeline
// ----------------------------------------------------------------------------------------------

fn chat_saying(text: &str) -> Value {
    json!({"model": "m", "messages": [{"role": "user", "content": text}], "stream": false})
}

fn content(response: Response) -> String {
    let body: Value = response.json().unwrap();
    body["message"]["content"].as_str().unwrap_or_default().to_string()
}

#[test]
fn routes_answer_the_requests_that_carry_their_key_and_the_script_the_rest() {
    let server = FakeLlm::start(vec![Reply::turn(Turn::text("from the script"))]);
    server.route("[b]", vec![Reply::turn(Turn::text("b1")), Reply::turn(Turn::text("b2"))]);
    server.route("[a]", vec![Reply::turn(Turn::text("a1"))]);
    let url = format!("{}/api/chat", server.url());
    let client = client();
    assert_eq!(content(post(&client, &url, &chat_saying("step [b]"))), "b1");
    assert_eq!(content(post(&client, &url, &chat_saying("step [a]"))), "a1");
    assert_eq!(content(post(&client, &url, &chat_saying("nothing routed"))), "from the script");
    assert_eq!(content(post(&client, &url, &chat_saying("step [b] again"))), "b2");
    let exhausted = post(&client, &url, &chat_saying("step [a] again"));
    assert_eq!(exhausted.status(), 500);
    assert!(exhausted.text().unwrap().contains("route `[a]` exhausted"));
    server.route("[a]", vec![Reply::turn(Turn::text("a2"))]);
    assert_eq!(content(post(&client, &url, &chat_saying("step [a]"))), "a2");
}

#[test]
fn two_replies_held_for_each_other_are_answered_only_once_both_requests_arrived() {
    let server = FakeLlm::start(Vec::new());
    server.route("[a]", vec![Reply::turn(Turn::text("a")).once_seen("[b]")]);
    server.route("[b]", vec![Reply::turn(Turn::text("b")).once_seen("[a]")]);
    let url = format!("{}/api/chat", server.url());
    let (a, b) = std::thread::scope(|scope| {
        let a = scope.spawn(|| content(post(&client(), &url, &chat_saying("[a]"))));
        // `a` is held until `b` arrives: this thread sends `b` only once `a` is in.
        while server.requests().is_empty() {
            std::thread::sleep(Duration::from_millis(5));
        }
        let b = scope.spawn(|| content(post(&client(), &url, &chat_saying("[b]"))));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!((a.as_str(), b.as_str()), ("a", "b"));
    let timeline = server.timeline();
    assert_eq!(&timeline[..2], [Moment::Arrived(0), Moment::Arrived(1)], "{timeline:?}");
    assert_eq!(timeline.len(), 4, "{timeline:?}");
}

#[test]
fn the_timeline_shows_one_request_after_the_others_answer() {
    let server = FakeLlm::start(vec![Reply::turn(Turn::text("1")), Reply::turn(Turn::text("2"))]);
    server.set_latency(Duration::from_millis(20));
    let url = format!("{}/api/chat", server.url());
    let client = client();
    post(&client, &url, &chat_saying("one")).text().unwrap();
    post(&client, &url, &chat_saying("two")).text().unwrap();
    assert_eq!(server.timeline(), [Moment::Arrived(0), Moment::Answered(0), Moment::Arrived(1), Moment::Answered(1)]);
}
