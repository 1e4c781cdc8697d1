//! The backends' environment variables. The test runs in a process of its own: it sets
//! process-wide variables, which no other test thread may read at the same time.

use codegen_core::backend::{BackendConfig, BackendKind, ChatRequest};
use codegen_core::chat::Message;
use promptgen_tests::{FakeLlm, Reply, Turn};

use crate::support::alone_in_a_process;

fn send(config: &BackendConfig) {
    let mut backend = config.open().unwrap();
    let messages = [Message::user("hi")];
    backend
        .chat(&ChatRequest {
            model: "m",
            messages: &messages,
            tools: &[],
            seed: None,
            temperature: None,
            constraint: None,
        })
        .unwrap();
}

#[test]
fn backends_read_their_variables_and_configuration_wins() {
    alone_in_a_process(concat!(module_path!(), "::backends_read_their_variables_and_configuration_wins"), || {
        let server = FakeLlm::start(vec![Reply::turn(Turn::text("ok")); 4]);
        let port = server.url().rsplit(':').next().unwrap().to_string();
        // SAFETY: this process runs this test alone, so no other thread reads the environment.
        unsafe {
            std::env::set_var("OLLAMA_HOST", format!("0.0.0.0:{port}"));
            std::env::set_var("OPENAI_BASE_URL", format!("{}/v1", server.url()));
            std::env::set_var("OPENAI_API_KEY", "sk-from-env");
        }

        send(&BackendConfig::new(BackendKind::Ollama));
        assert_eq!(server.requests()[0].path, "/api/chat", "OLLAMA_HOST's 0.0.0.0 means loopback");

        send(&BackendConfig::new(BackendKind::OpenAi));
        assert_eq!(server.requests()[1].path, "/v1/chat/completions");
        assert_eq!(server.requests()[1].header("authorization"), Some("Bearer sk-from-env"));

        let mut config = BackendConfig::new(BackendKind::OpenAi);
        config.base_url = Some(format!("{}/other/v1", server.url()));
        config.api_key = Some("sk-config".into());
        send(&config);
        assert_eq!(server.requests()[2].path, "/other/v1/chat/completions", "configuration beats OPENAI_BASE_URL");
        assert_eq!(server.requests()[2].header("authorization"), Some("Bearer sk-config"));

        unsafe { std::env::set_var("OPENAI_API_KEY", "") };
        send(&BackendConfig::new(BackendKind::OpenAi));
        assert_eq!(server.requests()[3].header("authorization"), None, "an empty key sends no header");
    });
}
