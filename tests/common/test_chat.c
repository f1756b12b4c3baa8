/* Chat templates: real templates from model cards (as llama.cpp's
 * tests/test-chat-template.cpp lists them) are recognised as their kind and
 * render llama.cpp's expected text for its six-message conversation; other
 * kinds are refused; names round-trip; a GGUF's own template (the qwen2
 * vocab fixture's) is found; the buffer contract holds.
 *
 * usage: test_chat QWEN2_VOCAB.gguf LLAMA_SPM_VOCAB.gguf */
#include <string.h>

#include "common/common.h"
#include "tests/test_util.h"

static const moex_chat_msg conv[] = {
    {"system", "You are a helpful assistant"}, {"user", "Hello"},
    {"assistant", "Hi there"},                 {"user", "Who are you"},
    {"assistant", "   I am an assistant   "},  {"user", "Another question"},
};
#define N_CONV ((int)(sizeof conv / sizeof conv[0]))

typedef struct tcase {
    const char *name, *tmpl;
    moex_chat_template want;
    const char *expected; /* with the assistant's turn opened */
} tcase;

static const tcase cases[] = {
    {"teknium/OpenHermes-2.5-Mistral-7B",
     "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
     "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
     MOEX_CHAT_CHATML,
     "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>"
     "assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n<|im_start|>assistant\n   I am an "
     "assistant   <|im_end|>\n<|im_start|>user\nAnother question<|im_end|>\n<|im_start|>assistant\n"},
    {"Qwen3 (excerpt)",
     "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- endif %}{%- for message in messages %}{{- '<|im_start|>' + "
     "message.role + '\\n' + content + '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- "
     "'<|im_start|>assistant\\n' }}{%- if enable_thinking is defined and enable_thinking is false %}{{- "
     "'<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}",
     MOEX_CHAT_CHATML, NULL},
    {"mistralai/Mistral-7B-Instruct-v0.2 (pre-v1, no system prompt)",
     "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ "
     "raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if "
     "message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == "
     "'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles "
     "are supported!') }}{% endif %}{% endfor %}",
     MOEX_CHAT_LLAMA2,
     "[INST] You are a helpful assistant\nHello [/INST]Hi there</s>[INST] Who are you [/INST]   I am an assistant   "
     "</s>[INST] Another question [/INST]"},
    {"TheBloke/FusionNet_34Bx2_MoE-AWQ",
     "{%- for idx in range(0, messages|length) -%}\n{%- if messages[idx]['role'] == 'user' -%}\n{%- if idx > 1 "
     "-%}\n{{- bos_token + '[INST] ' + messages[idx]['content'] + ' [/INST]' -}}\n{%- else -%}\n{{- "
     "messages[idx]['content'] + ' [/INST]' -}}\n{%- endif -%}\n{% elif messages[idx]['role'] == 'system' %}\n{{- "
     "'[INST] <<SYS>>\\n' + messages[idx]['content'] + '\\n<</SYS>>\\n\\n' -}}\n{%- elif messages[idx]['role'] == "
     "'assistant' -%}\n{{- ' '  + messages[idx]['content'] + ' ' + eos_token -}}\n{% endif %}\n{% endfor %}",
     MOEX_CHAT_LLAMA2_SYS_BOS,
     "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s><s>[INST] Who are you "
     "[/INST]   I am an assistant   </s><s>[INST] Another question [/INST]"},
    {"bofenghuang/vigogne-2-70b-chat (excerpt)",
     "{{ bos_token }}{% if message['role'] == 'user' %}{{ '[INST] ' + content.strip() + ' [/INST]' }}{% elif "
     "message['role'] == 'system' %}{{ '<<SYS>>\\n' + content.strip() + '\\n<</SYS>>\\n\\n' }}{% endif %}",
     MOEX_CHAT_LLAMA2_SYS_STRIP,
     "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s>[INST] Who are you "
     "[/INST]I am an assistant</s>[INST] Another question [/INST]"},
    {"Llama-3",
     "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
     "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 "
     "%}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{{ "
     "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}",
     MOEX_CHAT_LLAMA3,
     "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|><|start_header_id|>user<|"
     "end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi "
     "there<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWho are "
     "you<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nI am an "
     "assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnother "
     "question<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    {"mistralai/Mistral-7B-Instruct-v0.2 ('v1' with a system prompt, excerpt)",
     "{{- bos_token }}\n{%- for message in loop_messages %}\n{%- if loop.first and system_message is defined %}\n{{- "
     "' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}\n{%- else %}\n{{- ' [INST] ' + "
     "message['content'] + ' [/INST]' }}\n{%- endif %}{%- endfor %}",
     MOEX_CHAT_MISTRAL_V1,
     " [INST] You are a helpful assistant\n\nHello [/INST] Hi there</s> [INST] Who are you [/INST]    I am an "
     "assistant   </s> [INST] Another question [/INST]"},
    {"Mistral-Large-Instruct-2407 ('v3', excerpt)",
     "{{- \"[AVAILABLE_TOOLS] [\" }}{{- \"[INST] \" + message[\"content\"] + \"[/INST]\" }}", MOEX_CHAT_MISTRAL_V3,
     "[INST] You are a helpful assistant\n\nHello[/INST] Hi there</s>[INST] Who are you[/INST] I am an "
     "assistant</s>[INST] Another question[/INST]"},
    {"Mistral-Nemo-Instruct-2407 ('v3-tekken', excerpt)",
     "{{- \"[AVAILABLE_TOOLS][\" }}{{- \"[INST]\" + message[\"content\"] + \"[/INST]\" }}",
     MOEX_CHAT_MISTRAL_V3_TEKKEN,
     "[INST]You are a helpful assistant\n\nHello[/INST]Hi there</s>[INST]Who are you[/INST]   I am an assistant   "
     "</s>[INST]Another question[/INST]"},
    {"mistralai/Mistral-Large-Instruct-2411 ('v7')",
     "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + "
     "message['content'] + '[/INST]' }}{% elif message['role'] == 'system' %}{{ '[SYSTEM_PROMPT] ' + "
     "message['content'] + '[/SYSTEM_PROMPT]' }}{% elif message['role'] == 'assistant' %}{{ ' ' + "
     "message['content'] + eos_token }}{% else %}{{ raise_exception('Only user, system and assistant roles are "
     "supported!') }}{% endif %}{% endfor %}",
     MOEX_CHAT_MISTRAL_V7,
     "[SYSTEM_PROMPT] You are a helpful assistant[/SYSTEM_PROMPT][INST] Hello[/INST] Hi there</s>[INST] Who are "
     "you[/INST]    I am an assistant   </s>[INST] Another question[/INST]"},
    /* kinds moex does not render: refused, not rendered as something else */
    {"google/gemma-7b-it",
     "{% for message in messages %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + "
     "'<end_of_turn>\\n' }}{% endfor %}",
     MOEX_CHAT_UNKNOWN, NULL},
    {"phi-4", "{% for message in messages %}{{'<|im_start|>' + message['role'] + '<|im_sep|>' + message['content'] + "
              "'<|im_end|>'}}{% endfor %}",
     MOEX_CHAT_UNKNOWN, NULL},
    {"Phi-3-mini", "{% for message in messages %}{{'<|' + message['role'] + '|>' + '\\n' + message['content'] + "
                   "'<|end|>\\n' }}{% endfor %}{{ '<|assistant|>\\n' }}",
     MOEX_CHAT_UNKNOWN, NULL},
    {"a plain string", "Hello {{ name }}", MOEX_CHAT_UNKNOWN, NULL},
};

static void check_case(const tcase *c) {
    const moex_chat_template got = moex_chat_detect(c->tmpl, strlen(c->tmpl));
    CHECK(got == c->want, "%s: detected %s, want %s", c->name, moex_chat_name(got), moex_chat_name(c->want));
    if (!c->expected) return;
    char buf[2048];
    moex_error err = {0};
    const int64_t n = moex_chat_apply(c->want, conv, N_CONV, true, buf, sizeof buf, &err);
    CHECK(n == (int64_t)strlen(c->expected) && n < (int64_t)sizeof buf && !strcmp(buf, c->expected),
          "%s: rendered\n[%s]\nwant\n[%s]", c->name, n >= 0 ? buf : err.msg, c->expected);
}

/* A short buffer is never overrun; the length returned is the full one. */
static void check_buffer_contract(void) {
    char buf[16];
    memset(buf, 'x', sizeof buf);
    moex_error err = {0};
    const int64_t n = moex_chat_apply(MOEX_CHAT_CHATML, conv, 2, true, buf, 8, &err);
    CHECK(n > 8, "a long rendering reports its length (%lld)", (long long)n);
    CHECK(buf[8] == 'x', "nothing written past cap");
    CHECK(moex_chat_apply(MOEX_CHAT_CHATML, conv, 2, true, NULL, 0, &err) == n, "sizing with no buffer");
    const moex_chat_msg bad[] = {{"user", NULL}};
    CHECK(moex_chat_apply(MOEX_CHAT_CHATML, bad, 1, true, buf, sizeof buf, &err) < 0 && strstr(err.msg, "content"),
          "a message without content is an error");
    CHECK(moex_chat_apply(MOEX_CHAT_UNKNOWN, conv, 1, true, buf, sizeof buf, &err) < 0, "no template, no rendering");
}

static void check_names(void) {
    for (int t = MOEX_CHAT_UNKNOWN + 1; t < MOEX_CHAT_TEMPLATE_COUNT; t++) {
        const char *name = moex_chat_name((moex_chat_template)t);
        CHECK(moex_chat_from_name(name) == t, "name %s round-trips", name);
        CHECK(strstr(moex_chat_names(), name) != NULL, "%s is listed", name);
        CHECK(moex_chat_detect(name, strlen(name)) == t, "a template text that is just the name %s", name);
    }
    CHECK(moex_chat_from_name("jinja") == MOEX_CHAT_UNKNOWN && moex_chat_from_name(NULL) == MOEX_CHAT_UNKNOWN,
          "other names are unknown");
}

/* The model file's own template, a missing one, an override and a bad override. */
static void check_from_gguf(const char *qwen2_vocab, const char *spm_vocab) {
    moex_error err = {0};
    moex_gguf *qwen = moex_gguf_open(qwen2_vocab, &err), *spm = moex_gguf_open(spm_vocab, &err);
    CHECK(qwen && spm, "open the vocab fixtures: %s", err.msg);
    if (!qwen || !spm) return;
    moex_chat_template t = MOEX_CHAT_UNKNOWN;
    CHECK(moex_chat_template_of(qwen, NULL, &t, &err) == 0 && t == MOEX_CHAT_CHATML, "qwen2's template is ChatML (%s)",
          moex_chat_name(t));
    t = MOEX_CHAT_UNKNOWN;
    CHECK(moex_chat_template_of(spm, NULL, &t, &err) == 0 && t == MOEX_CHAT_CHATML, "no template: ChatML");
    CHECK(moex_chat_template_of(qwen, "llama3", &t, &err) == 0 && t == MOEX_CHAT_LLAMA3, "an override wins");
    err.msg[0] = 0;
    CHECK(moex_chat_template_of(qwen, "jinja", &t, &err) < 0 && strstr(err.msg, "chatml"),
          "an unknown name is an error listing the known ones: %s", err.msg);
    moex_gguf_close(qwen);
    moex_gguf_close(spm);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s QWEN2_VOCAB.gguf LLAMA_SPM_VOCAB.gguf\n", argv[0]);
        return 2;
    }
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(&cases[i]);
    check_buffer_contract();
    check_names();
    check_from_gguf(argv[1], argv[2]);
    if (g_failures) {
        fprintf(stderr, "%d checks failed\n", g_failures);
        return 1;
    }
    printf("chat templates ok\n");
    return 0;
}
