# ruff: noqa: RUF001  (the sentences are in other scripts on purpose)
"""Text beyond ASCII for measuring the prompt-token estimate (``bench.token_estimate``).

Sentences written for this project in eleven languages (Latin, Cyrillic, Greek, Arabic,
Devanagari, Han, Kana and Hangul scripts) plus emoji, and requests built from them the
way agents send them: a system prompt, a user turn, sometimes tools, a tool call and its
result (JSON with non-ASCII values). A tokenizer trained mostly on English splits these
scripts into many more tokens per character than English text.
"""

from __future__ import annotations

import json
import random
from typing import Any

SENTENCES: dict[str, list[str]] = {
    "fr": [
        "Pouvez-vous résumer le rapport financier du troisième trimestre en trois phrases ?",
        "Le déploiement a échoué parce que la clé d'accès était expirée depuis vendredi.",
        "Écrivez une fonction qui vérifie si une chaîne est un palindrome, sans espaces.",
        "Les élèves préfèrent les exercices pratiques à la théorie pure, d'après l'enquête.",
    ],
    "de": [
        "Bitte überprüfe die Konfigurationsdatei und öffne danach ein Ticket für das Team.",
        "Die Größe des Arbeitsspeichers reicht für größere Modelle leider nicht mehr aus.",
        "Können Sie mir erklären, warum die Abfrage so lange dauert? Sie läuft über zwölf Tabellen.",
        "Straßenbahnen fahren hier zwischen fünf Uhr morgens und Mitternacht.",
    ],
    "es": [
        "¿Cuál es la diferencia entre una lista enlazada y un arreglo dinámico?",
        "El niño leyó el capítulo entero antes de que su hermana volviera del colegio.",
        "Añade una sección de pruebas al informe y envíalo al equipo de operación mañana.",
    ],
    "pt": [
        "A reunião foi adiada para quinta-feira porque o diretor não está disponível.",
        "Você poderia traduzir este parágrafo para o inglês, mantendo o tom informal?",
    ],
    "ru": [
        "Пожалуйста, проверь журнал ошибок и скажи, почему сервис перезапускается каждую ночь.",
        "Напиши короткое письмо клиенту о задержке поставки на две недели.",
        "Сколько будет стоить аренда сервера с восемью ядрами на один месяц?",
    ],
    "el": [
        "Μπορείς να μου εξηγήσεις πώς λειτουργεί η κρυπτογράφηση δημόσιου κλειδιού;",
        "Η βάση δεδομένων χρειάζεται αντίγραφο ασφαλείας πριν από την αναβάθμιση.",
    ],
    "ar": [
        "هل يمكنك تلخيص هذا المقال في فقرة واحدة قصيرة؟",
        "تم تحديث النظام بنجاح، لكن بعض المستخدمين لا يستطيعون تسجيل الدخول.",
    ],
    "hi": [
        "कृपया इस रिपोर्ट का सारांश तीन वाक्यों में लिखिए।",
        "सर्वर हर रात दो बजे अपने आप फिर से शुरू हो जाता है।",
    ],
    "zh": [
        "请帮我总结这份报告的主要结论，并列出三个需要改进的地方。",
        "部署失败的原因是数据库连接超时，请检查网络配置。",
        "这个函数的时间复杂度是多少？能不能写一个更快的版本？",
        "明天上午十点开会，讨论下个季度的产品计划。",
    ],
    "ja": [
        "このエラーメッセージの意味を教えてください。ログには接続が拒否されたと書いてあります。",
        "来週の月曜日までに、テスト結果をまとめた資料を作成してください。",
        "東京から大阪までの新幹線は約二時間半かかります。",
    ],
    "ko": [
        "이 코드에서 메모리 누수가 발생하는 이유를 설명해 주세요.",
        "회의는 다음 주 화요일 오후 세 시로 변경되었습니다.",
    ],
    "emoji": [
        "Great job on the release 🎉🚀 — the dashboard looks 👍 and the latency graph is 📉!",
        "Status: ✅ build, ✅ tests, ❌ deploy (see 🔥 alerts) ⏳ retrying…",
    ],
}

TOOL = {
    "type": "function",
    "function": {
        "name": "search_documents",
        "description": "Full-text search over the team's documents, in any language",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "language": {"type": "string"}},
            "required": ["query"],
        },
    },
}


def requests(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` chat requests over ``SENTENCES``: deterministic for a seed."""
    rng = random.Random(seed)
    languages = sorted(SENTENCES)
    bodies = []
    for _ in range(n):
        lang = rng.choice(languages)
        pool = SENTENCES[lang]

        def text(k: int, pool: list[str] = pool) -> str:
            return " ".join(rng.choice(pool) for _ in range(k))

        msgs: list[dict[str, Any]] = []
        if rng.random() < 0.5:
            msgs.append({"role": "system", "content": text(rng.randint(1, 2))})
        msgs.append({"role": "user", "content": text(rng.randint(1, 6))})
        body: dict[str, Any] = {"messages": msgs}
        if rng.random() < 0.4:
            body["tools"] = [TOOL]
            args = json.dumps({"query": text(1)[:60], "language": lang}, ensure_ascii=False)
            call = {"id": "c1", "type": "function",
                    "function": {"name": "search_documents", "arguments": args}}  # fmt: skip
            hits = [{"title": text(1)[:40], "snippet": text(2)} for _ in range(rng.randint(1, 4))]
            msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
            msgs.append({"role": "tool", "tool_call_id": "c1",
                         "content": json.dumps(hits, ensure_ascii=False)})  # fmt: skip
        if rng.random() < 0.3:  # a question in English about the foreign text
            msgs.append({"role": "user", "content": "Translate the above into English."})
        bodies.append(body)
    return bodies
