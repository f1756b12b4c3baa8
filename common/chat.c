/* Chat templates (common/chat.h): detection by the markers llama.cpp's
 * llm_chat_detect_template looks for, rendering as its
 * llm_chat_apply_template does for the same kinds. */
#include <ctype.h>
#include <string.h>

#include "common/chat.h"

static const char *const names[MOEX_CHAT_TEMPLATE_COUNT] = {
    [MOEX_CHAT_UNKNOWN] = "unknown",
    [MOEX_CHAT_CHATML] = "chatml",
    [MOEX_CHAT_LLAMA3] = "llama3",
    [MOEX_CHAT_LLAMA2] = "llama2",
    [MOEX_CHAT_LLAMA2_SYS] = "llama2-sys",
    [MOEX_CHAT_LLAMA2_SYS_BOS] = "llama2-sys-bos",
    [MOEX_CHAT_LLAMA2_SYS_STRIP] = "llama2-sys-strip",
    [MOEX_CHAT_MISTRAL_V1] = "mistral-v1",
    [MOEX_CHAT_MISTRAL_V3] = "mistral-v3",
    [MOEX_CHAT_MISTRAL_V3_TEKKEN] = "mistral-v3-tekken",
    [MOEX_CHAT_MISTRAL_V7] = "mistral-v7",
};

const char *moex_chat_name(moex_chat_template t) {
    return t > MOEX_CHAT_UNKNOWN && t < MOEX_CHAT_TEMPLATE_COUNT ? names[t] : names[MOEX_CHAT_UNKNOWN];
}

const char *moex_chat_names(void) {
    return "chatml, llama3, llama2, llama2-sys, llama2-sys-bos, llama2-sys-strip, mistral-v1, mistral-v3, "
           "mistral-v3-tekken, mistral-v7";
}

moex_chat_template moex_chat_from_name(const char *name) {
    for (int t = MOEX_CHAT_UNKNOWN + 1; t < MOEX_CHAT_TEMPLATE_COUNT; t++)
        if (name && !strcmp(name, names[t])) return (moex_chat_template)t;
    return MOEX_CHAT_UNKNOWN;
}

/* ---- detection ---- */

typedef struct text_ref {
    const char *p;
    size_t n;
} text_ref;

static bool has(text_ref t, const char *needle) {
    const size_t k = strlen(needle);
    if (k > t.n) return false;
    for (size_t i = 0; i + k <= t.n; i++)
        if (t.p[i] == needle[0] && !memcmp(t.p + i, needle, k)) return true;
    return false;
}

/* The [INST] family: Mistral's official templates, else Llama 2's variants. */
static moex_chat_template detect_inst(text_ref t) {
    if (has(t, "[SYSTEM_PROMPT]")) return MOEX_CHAT_MISTRAL_V7;
    if (has(t, "' [INST] ' + system_message") || has(t, "[AVAILABLE_TOOLS]")) {
        if (has(t, " [INST]")) return MOEX_CHAT_MISTRAL_V1;
        if (has(t, "\"[INST]\"")) return MOEX_CHAT_MISTRAL_V3_TEKKEN;
        return MOEX_CHAT_MISTRAL_V3;
    }
    if (has(t, "content.strip()")) return MOEX_CHAT_LLAMA2_SYS_STRIP;
    if (has(t, "bos_token + '[INST]")) return MOEX_CHAT_LLAMA2_SYS_BOS;
    if (has(t, "<<SYS>>")) return MOEX_CHAT_LLAMA2_SYS;
    return MOEX_CHAT_LLAMA2;
}

moex_chat_template moex_chat_detect(const char *text, size_t len) {
    const text_ref t = {text, len};
    for (int k = MOEX_CHAT_UNKNOWN + 1; k < MOEX_CHAT_TEMPLATE_COUNT; k++) /* the text may be a name */
        if (strlen(names[k]) == len && !memcmp(text, names[k], len)) return (moex_chat_template)k;
    if (has(t, "<|im_start|>"))
        /* Phi-4 and SmolVLM use <|im_start|> too, but are not ChatML */
        return has(t, "<|im_sep|>") || has(t, "<end_of_utterance>") ? MOEX_CHAT_UNKNOWN : MOEX_CHAT_CHATML;
    if ((len >= 7 && !memcmp(text, "mistral", 7)) || has(t, "[INST]")) return detect_inst(t);
    /* llama.cpp tests these before Llama 3's markers; they are other kinds */
    static const char *const earlier[][2] = {
        {"<|assistant|>", "<|end|>"}, {"[gMASK]<sop>", ""}, {"<|assistant|>", "<|user|>"},
        {"<|{{ item['role'] }}|>", "<|begin_of_image|>"}, {"<|user|>", "<|endoftext|>"}, {"bos_token + message['role']", ""}, {"<start_of_turn>", ""},
        {"'\\n\\nAssistant: ' + eos_token", ""}, {"GPT4 Correct ", ""}, {"USER: ", "ASSISTANT: "},
        {"### Instruction:", "<|EOT|>"}, {"<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>"},
    };
    for (size_t i = 0; i < sizeof earlier / sizeof earlier[0]; i++)
        if (has(t, earlier[i][0]) && (!earlier[i][1][0] || has(t, earlier[i][1]))) return MOEX_CHAT_UNKNOWN;
    if (has(t, "<|start_header_id|>") && has(t, "<|end_header_id|>")) return MOEX_CHAT_LLAMA3;
    return MOEX_CHAT_UNKNOWN;
}

int moex_chat_template_of(const moex_gguf *g, const char *name, moex_chat_template *out, moex_error *err) {
    if (name) {
        *out = moex_chat_from_name(name);
        if (*out == MOEX_CHAT_UNKNOWN)
            return moex_fail(err, "unknown chat template '%s' (known: %s)", name, moex_chat_names());
        return 0;
    }
    const moex_gguf_kv *kv = g ? moex_gguf_find(g, "tokenizer.chat_template") : NULL;
    if (!kv) {
        *out = MOEX_CHAT_CHATML;
        return 0;
    }
    if (kv->value.type != MOEX_GGUF_STRING)
        return moex_fail(err, "tokenizer.chat_template is a %s, not a string: pass --chat-template NAME (%s)",
                         moex_gguf_vtype_name(kv->value.type), moex_chat_names());
    *out = moex_chat_detect(kv->value.v.str.data, kv->value.v.str.len);
    if (*out == MOEX_CHAT_UNKNOWN)
        return moex_fail(err, "the model's chat template (tokenizer.chat_template, %llu bytes) is not one moex "
                         "recognises: pass --chat-template NAME (%s)",
                         (unsigned long long)kv->value.v.str.len, moex_chat_names());
    return 0;
}

/* ---- rendering ---- */

/* Appends to buf while it has room, counts every byte regardless. */
typedef struct out_buf {
    char *buf;
    int64_t cap, len;
} out_buf;

static void put_n(out_buf *o, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++, o->len++)
        if (o->len < o->cap) o->buf[o->len] = s[i];
}

static void put(out_buf *o, const char *s) { put_n(o, s, strlen(s)); }

/* s without leading and trailing white space (as llama.cpp's trim). */
static void put_trimmed(out_buf *o, const char *s) {
    size_t a = 0, b = strlen(s);
    while (a < b && isspace((unsigned char)s[a])) a++;
    while (b > a && isspace((unsigned char)s[b - 1])) b--;
    put_n(o, s + a, b - a);
}

static bool is_role(const moex_chat_msg *m, const char *role) { return !strcmp(m->role, role); }

static void render_chatml(out_buf *o, const moex_chat_msg *msgs, int n, bool add_assistant) {
    for (int i = 0; i < n; i++) {
        put(o, "<|im_start|>");
        put(o, msgs[i].role);
        put(o, "\n");
        put(o, msgs[i].content);
        put(o, "<|im_end|>\n");
    }
    if (add_assistant) put(o, "<|im_start|>assistant\n");
}

static void render_llama3(out_buf *o, const moex_chat_msg *msgs, int n, bool add_assistant) {
    for (int i = 0; i < n; i++) {
        put(o, "<|start_header_id|>");
        put(o, msgs[i].role);
        put(o, "<|end_header_id|>\n\n");
        put_trimmed(o, msgs[i].content);
        put(o, "<|eot_id|>");
    }
    if (add_assistant) put(o, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

static void render_llama2(out_buf *o, moex_chat_template t, const moex_chat_msg *msgs, int n) {
    const bool with_sys = t != MOEX_CHAT_LLAMA2, bos_inside = t == MOEX_CHAT_LLAMA2_SYS_BOS,
               strip = t == MOEX_CHAT_LLAMA2_SYS_STRIP;
    bool inside_turn = true; /* the BOS of the first turn comes from the tokenizer */
    put(o, "[INST] ");
    for (int i = 0; i < n; i++) {
        const moex_chat_msg *m = &msgs[i];
        if (!inside_turn) {
            inside_turn = true;
            put(o, bos_inside ? "<s>[INST] " : "[INST] ");
        }
        if (is_role(m, "system")) {
            if (with_sys) put(o, "<<SYS>>\n");
            strip ? put_trimmed(o, m->content) : put(o, m->content);
            put(o, with_sys ? "\n<</SYS>>\n\n" : "\n");
        } else if (is_role(m, "user")) {
            strip ? put_trimmed(o, m->content) : put(o, m->content);
            put(o, " [/INST]");
        } else {
            strip ? put_trimmed(o, m->content) : put(o, m->content);
            put(o, "</s>");
            inside_turn = false;
        }
    }
}

static void render_mistral(out_buf *o, moex_chat_template t, const moex_chat_msg *msgs, int n) {
    const char *lead = t == MOEX_CHAT_MISTRAL_V1 ? " " : "", *trail = t == MOEX_CHAT_MISTRAL_V3_TEKKEN ? "" : " ";
    const bool trim_assistant = t == MOEX_CHAT_MISTRAL_V3;
    bool inside_turn = false;
    for (int i = 0; i < n; i++) {
        const moex_chat_msg *m = &msgs[i];
        if (!inside_turn) {
            put(o, lead);
            put(o, "[INST]");
            put(o, trail);
            inside_turn = true;
        }
        if (is_role(m, "system")) {
            put(o, m->content);
            put(o, "\n\n");
        } else if (is_role(m, "user")) {
            put(o, m->content);
            put(o, lead);
            put(o, "[/INST]");
        } else {
            put(o, trail);
            trim_assistant ? put_trimmed(o, m->content) : put(o, m->content);
            put(o, "</s>");
            inside_turn = false;
        }
    }
}

static void render_mistral_v7(out_buf *o, const moex_chat_msg *msgs, int n) {
    for (int i = 0; i < n; i++) {
        const moex_chat_msg *m = &msgs[i];
        if (is_role(m, "system")) {
            put(o, "[SYSTEM_PROMPT] ");
            put(o, m->content);
            put(o, "[/SYSTEM_PROMPT]");
        } else if (is_role(m, "user")) {
            put(o, "[INST] ");
            put(o, m->content);
            put(o, "[/INST]");
        } else {
            put(o, " ");
            put(o, m->content);
            put(o, "</s>");
        }
    }
}

int64_t moex_chat_apply(moex_chat_template t, const moex_chat_msg *msgs, int n, bool add_assistant, char *buf,
                        int64_t cap, moex_error *err) {
    for (int i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content) return moex_fail(err, "message %d has no role or no content", i);
    out_buf o = {.buf = buf, .cap = buf ? cap : 0};
    switch (t) {
    case MOEX_CHAT_CHATML: render_chatml(&o, msgs, n, add_assistant); break;
    case MOEX_CHAT_LLAMA3: render_llama3(&o, msgs, n, add_assistant); break;
    case MOEX_CHAT_LLAMA2:
    case MOEX_CHAT_LLAMA2_SYS:
    case MOEX_CHAT_LLAMA2_SYS_BOS:
    case MOEX_CHAT_LLAMA2_SYS_STRIP: render_llama2(&o, t, msgs, n); break;
    case MOEX_CHAT_MISTRAL_V1:
    case MOEX_CHAT_MISTRAL_V3:
    case MOEX_CHAT_MISTRAL_V3_TEKKEN: render_mistral(&o, t, msgs, n); break;
    case MOEX_CHAT_MISTRAL_V7: render_mistral_v7(&o, msgs, n); break;
    default: return moex_fail(err, "no chat template to render with");
    }
    if (o.len < o.cap) o.buf[o.len] = '\0';
    return o.len;
}
