/* jaxmem explore: the page. Plain JavaScript, no build step and nothing from the network: it reads the
   explorer's HTTP API (GET /api/controls, /api/answer, /api/points, /api/advise, /api/fit, /api/save) and draws
   the answer. Every number shown comes from the server's report; the page only formats it, with ports of
   jaxmem/units.py's fmt_bytes and fmt_seconds so that it prints what the CLI prints. */
(function () {
  'use strict';

  // ------------------------------------------------------------------------------------- formatting
  // Python's f"{x:.Nf}": correctly rounded, ties to even. JS toFixed rounds ties away from zero, so an exact tie
  // (e.g. 1.125 GiB) is detected on the exact decimal expansion and settled as Python settles it.
  function pyFixed(x, d) {
    var s = x.toFixed(d);
    var full = Math.abs(x).toFixed(100);
    var point = full.indexOf('.');
    var tail = full.slice(point + 1 + d);
    if (tail[0] !== '5' || !/^50*$/.test(tail)) return s;
    var kept = full.slice(0, point + 1 + d).replace(/\.$/, '');
    var last = kept.replace('.', '').slice(-1);
    if (Number(last) % 2 === 0) return (x < 0 ? '-' : '') + kept;
    return s;
  }

  var UNITS = [['GiB', 1073741824], ['MiB', 1048576], ['KiB', 1024]];
  function fmtBytes(n) {               // jaxmem.units.fmt_bytes
    if (n === null || n === undefined) return '-';
    var sign = n < 0 ? '-' : '';
    n = Math.abs(n);
    for (var i = 0; i < UNITS.length; i++) {
      if (n >= UNITS[i][1]) return sign + pyFixed(n / UNITS[i][1], 2) + ' ' + UNITS[i][0];
    }
    return sign + n + ' B';
  }
  function fmtSeconds(x) {             // jaxmem.units.fmt_seconds
    if (x === null || x === undefined) return '-';
    if (x >= 1) return pyFixed(x, 2) + ' s';
    if (x >= 1e-3) return pyFixed(x * 1e3, 1) + ' ms';
    return pyFixed(x * 1e6, 1) + ' us';
  }
  function fmtRate(x) {
    if (!isFinite(x)) return '-';
    if (x >= 1e6) return pyFixed(x / 1e6, 2) + ' M';
    return Math.round(x).toLocaleString('en-US');
  }
  function share(v, whole) { return pyFixed(whole > 0 ? 100 * v / whole : 0, 1) + '%'; }
  function esc(x) {
    return String(x === null || x === undefined ? '' : x).replace(/[&<>"']/g, function (c) {
      return {'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;'}[c];
    });
  }
  function $(id) { return document.getElementById(id); }

  // The report's vocabulary -- the breakdown's keys in order, their help and colours, the verdicts' words -- is
  // /api/controls' `schema` (jaxmem.report and the HTML report's colours, served by Python): no copy lives here.
  // Only the verdict's badge style is the page's own.
  var BADGE = {fits: 'ok', tight: 'warn', does_not_fit: 'bad'};
  function schema() { return (S.info && S.info.raw && S.info.raw.schema) || {breakdown: [], colors: {}, verdicts: {}}; }
  function colorOf(key, i) {
    var sc = schema(), fb = sc.fallback_colors || ['#8c959f'];
    var known = (sc.breakdown || []).find(function (b) { return b.key === key; });
    return (known && known.color) || (sc.colors || {})[key] || fb[(i || 0) % fb.length];
  }
  function verdictWords(v) {
    var w = (schema().verdicts || {})[v];
    return w ? [w.toUpperCase(), BADGE[v] || 'na'] : null;
  }
  // The breakdown's parts in the schema's order, any key it does not know after them (report.breakdown_in_order)
  function partsOf(r) {
    var bd = r.breakdown || {}, out = [], seen = {};
    (schema().breakdown || []).forEach(function (b) {
      seen[b.key] = true;
      if (b.key in bd) out.push({key: b.key, label: b.label, help: b.help, bytes: bd[b.key] || 0});
    });
    Object.keys(bd).forEach(function (k) {
      if (!seen[k]) out.push({key: k, label: k.replace(/_/g, ' '), help: '', bytes: bd[k] || 0});
    });
    return out;
  }

  // ------------------------------------------------------------------------------------------ state
  var S = {
    info: null,          // /api/controls
    start: {},           // the starting point's query
    query: {},           // the point on screen (option name -> string)
    seq: 0,              // bumps on every move: an answer to an older move is dropped
    shown: null,         // the last answer drawn {key, answer, report, command}
    predictions: {},     // key -> the predicted report shown for it (to say how far it was when the exact lands)
    history: [],         // [{key, answer, at}] every answer the page received, oldest first (tests read it)
    points: [],
    pins: [],            // the keys of the (at most two) points pinned to compare (the fragment carries their queries)
    changed: null,       // the control last moved (a 400 names it)
    timer: null, poll: null, polls: 0, pollSeq: 0, advisePoll: null, fitPoll: null
  };
  window.jaxmemExplore = {state: S, fmtBytes: fmtBytes, fmtSeconds: fmtSeconds,
    stripLabels: function (pts) { return stripLabels(pts); }};

  function qs(q, extra) {
    var p = new URLSearchParams();
    Object.keys(q).sort().forEach(function (k) { p.append(k, q[k]); });
    Object.keys(extra || {}).forEach(function (k) { p.append(k, extra[k]); });
    return p.toString();
  }
  // Every API address is built here and every call goes through getJSON (which carries the token)
  function api(route, q, extra) {
    var query = qs(q || {}, extra);
    return '/api/' + route + (query ? '?' + query : '');
  }
  // the server's token (docs/explore.md, "Security"): written into the page it serves; every API call carries it
  var TOKEN = (document.querySelector('meta[name="jaxmem-token"]') || {}).content || '';
  function getJSON(url) {
    return fetch(url, {cache: 'no-store', headers: {'X-Jaxmem-Token': TOKEN}}).then(function (r) {
      return r.text().then(function (t) {
        var d;
        try { d = JSON.parse(t); } catch (e) { d = {error: 'the server answered ' + r.status + ': ' + t.slice(0, 200)}; }
        setConn(true);
        return {ok: r.ok, status: r.status, data: d};
      });
    }, function (e) { setConn(false); throw e; });
  }
  function setConn(up) {
    var c = $('conn');
    c.textContent = up ? '' : 'the explorer is not answering (stopped?) — retrying';
    c.className = up ? '' : 'down';
  }
  function toast(msg) {
    var t = $('toast');
    t.textContent = msg; t.style.display = 'block';
    clearTimeout(toast.t); toast.t = setTimeout(function () { t.style.display = 'none'; }, 1800);
  }

  // --------------------------------------------------------------------------------------- controls
  var GROUPS = [
    ['Card and mesh', ['gpu', 'mesh', 'layout', 'hosts', 'axis-roles', 'axis-types', 'mem-fraction']],
    ['Batch and sequence', ['batch', 'accum']],
    ['Memory', ['remat', 'remat-at', 'precision', 'optimizer', 'moment-dtype', 'offload', 'no-donate']],
    ['Fine-tuning', ['lora', 'lora-targets', 'lora-alpha', 'base-dtype', 'freeze', 'train-all']],
    ['Pipeline', ['stages', 'pipeline', 'microbatches', 'repeats', 'stage-remat']],
    ['The model\'s arguments', []],
    ['More', []]
  ];
  var MODEL_GROUP = GROUPS.length - 2;
  function seqArg() { return S.info && S.info.raw && S.info.raw.seq_arg; }
  function groupOf(name) {
    if (name === 'arg.' + seqArg()) return 1;
    if (name.indexOf('arg.') === 0) return MODEL_GROUP;
    for (var i = 0; i < GROUPS.length - 2; i++) if (GROUPS[i][1].indexOf(name) >= 0) return i;
    return GROUPS.length - 1;
  }
  function value(name) {
    if (name === 'stages') return String(stagesOf(value('mesh')));
    var c = controlNamed(name);
    var v = S.query[name];
    if (v === undefined && c && c.arg && c.arg.config_field) return c.kind === 'flag' ? presetValue(c) : '';
    if (v === undefined) v = c && c.default !== undefined && c.default !== null && c.default !== false ? String(c.default) : '';
    return String(v);
  }
  // A model file's Config field left to the model: the value its preset sets (PRESETS), else Config's default
  function presetValue(c) {
    var a = c.arg, preset = value('arg.preset'), by = a.by_preset || {};
    var v = preset in by ? by[preset] : a.default;
    return v === null || v === undefined ? '' : String(v);
  }
  function controlNamed(name) {
    var cs = (S.info && S.info.controls) || [];
    for (var i = 0; i < cs.length; i++) if (cs[i].name === name) return cs[i];
    return null;
  }

  // /api/controls as the server writes it (lists of the values the CLI accepts, and every analyze option's
  // kind) into the page's controls, each with only the values this model and this card accept.
  var SKIP = ['rules', 'no-cache', 'no-explain', 'top', 'depth'];
  var LABELS = {gpu: 'card', layout: 'layout', 'axis-types': 'axis types', 'axis-roles': 'axis roles',
    batch: 'batch', accum: 'accumulation', remat: 'remat', 'remat-at': 'remat at', precision: 'precision',
    optimizer: 'optimizer', offload: 'offload', 'no-donate': 'no donation', lora: 'LoRA rank',
    'lora-targets': 'LoRA targets', 'lora-alpha': 'LoRA alpha', 'base-dtype': 'base (QLoRA)', freeze: 'freeze',
    'train-all': 'train all', pipeline: 'schedule', microbatches: 'microbatches', repeats: 'repeats',
    'stage-remat': 'stage remat', hosts: 'hosts', 'mem-fraction': 'memory share', 'moment-dtype': 'moment dtype',
    stages: 'stages'};
  function pow2(lo, hi, extra) {
    var out = [];
    for (var v = lo; v <= hi; v *= 2) out.push(v);
    (extra || []).forEach(function (x) { if (x && out.indexOf(x) < 0) out.push(x); });
    return out.sort(function (a, b) { return a - b; });
  }
  function buildControls(raw) {
    if (raw.controls) return raw.controls;           // a server that sends the page's own shape
    var opts = {}, out = [], done = {};
    (raw.options || []).forEach(function (o) { opts[o.name] = o; });
    function add(name, extra) {
      var o = opts[name] || {};
      var c = {name: name, label: LABELS[name] || name, help: o.help || '',
        default: o.default === null || o.default === undefined || o.default === false ? '' : o.default};
      Object.keys(extra).forEach(function (k) { c[k] = extra[k]; });
      done[name] = true;
      out.push(c);
    }
    function list(xs) { return (xs || []).map(function (x) { return {value: String(x), label: String(x)}; }); }
    var gpu = S.query.gpu || (raw.start || {}).gpu || '';
    add('gpu', {kind: 'select', none_label: 'local GPU, else h100', choices: (raw.gpus || []).map(function (g) {
      return {value: g.name, label: g.name + ' · ' + fmtBytes(g.memory_bytes), note: g.description,
        group: g.cloud ? 'cloud machine types' : 'cards'};
    })});
    add('mesh', {kind: 'mesh'});
    add('layout', {kind: 'select', choices: list(raw.layouts || (opts.layout || {}).choices)});
    var b = raw.batch || {}, g = Number(b.granule) || 1, bv = Number(b.value) || 0;
    add('batch', {kind: 'int', min: g, values: pow2(g, Math.max(g * 1024, bv * 16), [bv]),
      help: 'global batch; a multiple of ' + g + ' (the data-parallel devices × accumulation)'});
    modelArgControls(raw).forEach(function (c) { done[c.name] = true; out.push(c); });
    add('accum', {kind: 'int', min: 1, values: raw.accum || [1, 2, 4, 8]});
    add('remat', {kind: 'select', choices: list(raw.remat)});
    add('remat-at', {kind: 'text', placeholder: 'the model\'s own hook'});
    var fp8 = (raw.fp8_gpus || []).indexOf(gpu) >= 0 || !gpu && (raw.fp8_gpus || []).indexOf('h100') >= 0;
    add('precision', {kind: 'select', choices: list((raw.precisions || []).filter(function (x) { return x !== 'fp8' || fp8; }))});
    add('optimizer', {kind: 'select', none_label: 'the workload\'s own', choices: list(raw.optimizers)});
    if (opts['moment-dtype']) add('moment-dtype', {kind: 'select', none_label: 'the optimizer\'s', choices: list(opts['moment-dtype'].choices)});
    add('offload', {kind: 'select', none_label: 'nothing', choices: list(raw.offloads)});
    add('no-donate', {kind: 'flag'});
    add('lora', {kind: 'int', min: 0, values: raw.lora_ranks || [0, 8, 16, 32, 64]});
    add('lora-targets', {kind: 'text', placeholder: 'every dense layer'});
    add('lora-alpha', {kind: 'text', placeholder: 'the rank'});
    add('base-dtype', {kind: 'select', none_label: 'as trained', choices: list(raw.base_dtypes)});
    add('freeze', {kind: 'text', placeholder: 'nothing frozen'});
    add('train-all', {kind: 'flag'});
    out.push({name: 'stages', label: 'stages', kind: 'int', min: 1, values: raw.stages || [1, 2, 4, 8], default: '1',
      help: 'pipeline stages: the size of the mesh\'s stage axis'});
    add('pipeline', {kind: 'select', choices: list(raw.pipelines)});
    add('microbatches', {kind: 'int', min: 1, values: [1, 2, 4, 8, 16, 32], placeholder: 'auto'});
    add('repeats', {kind: 'int', min: 1, values: [1, 2, 4, 8], placeholder: 'auto'});
    add('stage-remat', {kind: 'flag'});
    add('hosts', {kind: 'int', min: 1, values: [1, 2, 4, 8, 16, 32, 64], placeholder: 'auto'});
    (raw.options || []).forEach(function (o) {       // any other option analyze has, by its kind
      if (done[o.name] || o.pinned || SKIP.indexOf(o.name) >= 0) return;
      var kind = o.kind === 'choice' ? 'select' : o.kind === 'switch' ? 'flag' :
        (o.kind === 'whole' || o.kind === 'count') ? 'int' : 'text';
      add(o.name, {kind: kind, choices: list(o.choices)});
    });
    return out;
  }
  // The model's own arguments (/api/controls' model_args: its workload()'s or its config.json's), each as a
  // control of its kind, with the range the model states; those another control sets (batch, remat) are skipped.
  function modelArgControls(raw) {
    var ma = raw.model_args || {}, ctx = raw.context, out = [];
    (ma.args || []).forEach(function (a) {
      if (a.via) return;
      var name = 'arg.' + a.name, isSeq = a.name === raw.seq_arg;
      var c = {name: name, label: isSeq ? 'sequence length' : a.name.replace(/_/g, ' '), arg: a,
        default: a.config_field || a.default === null || a.default === undefined ? '' : String(a.default),
        help: (a.help || '') + ' (--arg ' + a.name + '=…)'};
      if (a.kind === 'int') {
        var d = Number(a.default) || 0, top = a.max || 0;
        c.kind = 'int'; c.min = a.min; c.max = a.max;
        c.values = isSeq ? pow2(128, Math.max(131072, (ctx && ctx.tokens) || 0), [d, ctx && ctx.tokens])
          : pow2(1, Math.max(64, 4 * d), [d]).filter(function (v) { return !top || v <= top; });
        c.placeholder = a.default === null || a.default === undefined ? 'the model\'s' : String(a.default);
        var range = (a.min !== undefined ? a.min : '') + (a.max ? '–' + Number(a.max).toLocaleString('en-US') : '+');
        c.hint = (isSeq && ctx ? 'context ' + Number(ctx.tokens).toLocaleString('en-US') + ' (' + ctx.field + ')' :
          (a.min !== undefined || a.max ? 'range ' + range : '')) + (a.divides ? (c.hint ? '; ' : '') + 'divides ' + a.divides : '');
      } else if (a.kind === 'choice') {
        c.kind = 'select'; c.choices = (a.choices || []).map(function (x) { return {value: String(x), label: String(x)}; });
      } else if (a.kind === 'bool') {
        c.kind = 'flag'; c.onValue = 'true'; c.offValue = 'false';
      } else if (a.kind === 'text') {
        c.kind = 'text'; c.fixed = true;
        c.help = 'fixed for this explorer (a text argument may name a file): restart with --arg ' + a.name + '=…';
      } else {
        c.kind = 'text'; c.placeholder = a.kind === 'names' ? 'e.g. ' + (a.choices || []).slice(0, 2).join(',') : String(c.default || '');
        if (a.kind === 'names') c.help = a.help + ': ' + (a.choices || []).join(', ');
      }
      out.push(c);
    });
    return out;
  }
  function normalize(raw) {
    var roles = raw.mesh_roles || (raw.mesh || {}).roles;
    return {model: raw.model, source: raw.source, start: raw.start || {}, raw: raw, controls: buildControls(raw),
      mesh: {roles: roles, device_counts: raw.device_counts || (raw.mesh || {}).device_counts,
        presets: raw.mesh_presets || (raw.mesh || {}).presets || []}};
  }

  function renderControls() {
    var box = $('controls');
    box.innerHTML = '';
    var sets = GROUPS.map(function (g) {
      var fs = document.createElement('fieldset');
      fs.innerHTML = '<legend>' + esc(g[0]) + '</legend>';
      return fs;
    });
    var cs = S.info.controls.slice();
    // within a group: the order the group lists, then the server's order
    cs.sort(function (a, b) {
      var ga = groupOf(a.name), gb = groupOf(b.name);
      if (ga !== gb) return ga - gb;
      var la = GROUPS[ga][1].indexOf(a.name), lb = GROUPS[gb][1].indexOf(b.name);
      if (la < 0) la = a.name.indexOf('arg.') === 0 ? -1 : 99;
      if (lb < 0) lb = b.name.indexOf('arg.') === 0 ? -1 : 99;
      return la - lb;
    });
    cs.forEach(function (c) { sets[groupOf(c.name)].appendChild(controlRow(c)); });
    sets.forEach(function (fs) { if (fs.children.length > 1) box.appendChild(fs); });
    syncControls();
  }

  function controlRow(c) {
    var row = document.createElement('div');
    row.className = 'ctl';
    row.dataset.name = c.name;
    var id = 'ctl-' + c.name.replace(/[^a-zA-Z0-9]/g, '-');
    var label = c.label || (c.name.indexOf('arg.') === 0 ? c.name.slice(4).replace(/_/g, ' ') : c.name);
    row.innerHTML = '<label for="' + id + '" title="' + esc(c.help || '') + '">' + esc(label) + '</label>';
    var kind = c.kind;
    if (kind === 'select') row.appendChild(selectInput(c, id));
    else if (kind === 'int') row.appendChild(intInput(c, id));
    else if (kind === 'flag') row.appendChild(flagInput(c, id));
    else if (kind === 'mesh') meshInput(c, id, row);
    else row.appendChild(textInput(c, id));
    if (c.hint) {
      var hint = document.createElement('div');
      hint.className = 'hint'; hint.textContent = c.hint;
      row.appendChild(hint);
    }
    var warn = document.createElement('div');   // a value the model takes but warns about (past its context)
    warn.className = 'warnline'; warn.hidden = true;
    row.appendChild(warn);
    var err = document.createElement('div');
    err.className = 'err'; err.hidden = true;
    row.appendChild(err);
    return row;
  }

  function selectInput(c, id) {
    var sel = document.createElement('select');
    sel.id = id;
    sel.addEventListener('change', function () { move(c.name, sel.value, 0); });
    return sel;
  }
  function fillSelect(sel, c, v) {
    var choices = (c.choices || []).map(function (ch) {
      return typeof ch === 'object' ? ch : {value: String(ch), label: String(ch)};
    });
    var html = [], groups = {}, order = [];
    var hasEmpty = choices.some(function (ch) { return String(ch.value) === ''; });
    if (!hasEmpty && (c.default === '' || c.default === null || c.default === undefined || v === '')) {
      html.push('<option value="">' + esc(c.none_label || (c.default ? 'default (' + c.default + ')' : '—')) +
        '</option>');
    }
    var known = false;
    choices.forEach(function (ch) {
      var g = ch.group || '';
      if (!(g in groups)) { groups[g] = []; order.push(g); }
      if (String(ch.value) === v) known = true;
      groups[g].push('<option value="' + esc(ch.value) + '"' + (ch.note ? ' title="' + esc(ch.note) + '"' : '') +
        '>' + esc(ch.label || ch.value) + '</option>');
    });
    order.forEach(function (g) {
      html.push(g ? '<optgroup label="' + esc(g) + '">' + groups[g].join('') + '</optgroup>' : groups[g].join(''));
    });
    if (!known && v !== '') html.push('<option value="' + esc(v) + '">' + esc(v) + ' (not offered here)</option>');
    var key = html.join('');
    if (sel.dataset.key !== key) { sel.innerHTML = key; sel.dataset.key = key; }
    sel.value = v;
  }

  // A number: type it, or step through the values people use (−/+ or the arrow keys).
  function ladder(c) { return (c.values || []).map(Number).filter(isFinite).sort(function (a, b) { return a - b; }); }
  function stepOf(c, cur, dir) {
    var lad = ladder(c), n = Number(cur), min = c.min === undefined || c.min === null ? 0 : Number(c.min);
    if (cur === '' || !isFinite(n)) return lad.length ? lad[0] : Math.max(min, 1);
    if (dir > 0) {
      for (var i = 0; i < lad.length; i++) if (lad[i] > n) return lad[i];
      var up = n > 0 ? n * 2 : 1;
      return c.max !== undefined && c.max !== null ? Math.min(up, Number(c.max)) : up;
    }
    for (var j = lad.length - 1; j >= 0; j--) if (lad[j] < n) return lad[j];
    return Math.max(min, Math.floor(n / 2));
  }
  function intInput(c, id) {
    var wrap = document.createElement('div');
    wrap.className = 'stepper';
    wrap.innerHTML = '<button type="button" class="dec" aria-label="smaller ' + esc(c.name) + '">−</button>' +
      '<input type="text" inputmode="numeric" id="' + id + '" autocomplete="off" placeholder="' + esc(c.placeholder || '') + '">' +
      '<button type="button" class="inc" aria-label="larger ' + esc(c.name) + '">+</button>';
    var inp = wrap.querySelector('input');
    function stepTo(dir) {
      // an empty field stands for the model's own value, which the placeholder shows once it is known
      var shown = (inp.placeholder.match(/-?\d+/) || [''])[0];
      var cur = inp.value !== '' ? inp.value : shown;
      var v = String(stepOf(c, cur, dir));
      inp.value = v;
      move(c.name, v, 120);
    }
    wrap.querySelector('.dec').addEventListener('click', function () { stepTo(-1); });
    wrap.querySelector('.inc').addEventListener('click', function () { stepTo(1); });
    inp.addEventListener('keydown', function (ev) {
      if (ev.key === 'ArrowUp') { ev.preventDefault(); stepTo(1); }
      else if (ev.key === 'ArrowDown') { ev.preventDefault(); stepTo(-1); }
      else if (ev.key === 'Enter') { ev.preventDefault(); move(c.name, inp.value.trim(), 0); }
    });
    // typing: wait until the person pauses, then ask (the server checks the value as the CLI does)
    inp.addEventListener('input', function () { move(c.name, inp.value.trim(), 450); });
    return wrap;
  }
  function flagInput(c, id) {
    var l = document.createElement('label');
    l.className = 'check';
    l.innerHTML = '<input type="checkbox" id="' + id + '"><span class="note">' + esc(c.help ? '' : '') + '</span>';
    var box = l.querySelector('input');
    box.addEventListener('change', function () {
      move(c.name, box.checked ? (c.onValue || '1') : (c.offValue || '0'), 0);
    });
    return l;
  }
  function textInput(c, id) {
    var inp = document.createElement('input');
    inp.type = 'text'; inp.id = id; inp.autocomplete = 'off'; inp.spellcheck = false;
    inp.placeholder = c.placeholder || (c.default ? String(c.default) : 'none');
    if (c.fixed) { inp.readOnly = true; inp.title = c.help || ''; inp.classList.add('fixed'); return inp; }
    inp.addEventListener('change', function () { move(c.name, inp.value.trim(), 0); });
    inp.addEventListener('keydown', function (ev) {
      if (ev.key === 'Enter') { ev.preventDefault(); move(c.name, inp.value.trim(), 0); }
    });
    return inp;
  }

  // ---- the mesh: a device count, presets for the common layouts at that count, and the axes themselves
  function parseMesh(s) {
    return String(s || '').split(',').map(function (p) { return p.trim(); }).filter(Boolean).map(function (p) {
      var kv = p.split('='), size = (kv[1] || '').trim();
      // a size that is not a number stays as typed: the server refuses it with the CLI's words
      return [kv[0].trim(), size !== '' && isFinite(Number(size)) ? Number(size) : size];
    });
  }
  function meshText(axes) { return axes.map(function (a) { return a[0] + '=' + a[1]; }).join(','); }
  function devicesOf(axes) { return axes.reduce(function (n, a) { return n * (a[1] > 0 ? a[1] : 1); }, 1); }
  function meshRoles() {
    var m = (S.info && S.info.mesh) || {};
    return m.roles && m.roles.length ? m.roles : ['data', 'fsdp', 'tensor', 'context', 'expert', 'stage'];
  }
  function stagesOf(mesh) {
    var a = parseMesh(mesh).find(function (x) { return x[0] === 'stage' || x[0] === 'pp'; });
    return a ? a[1] : 1;
  }
  function withStages(mesh, k) {
    var ax = parseMesh(mesh);
    var i = ax.findIndex(function (x) { return x[0] === 'stage' || x[0] === 'pp'; });
    var old = i >= 0 ? ax[i][1] : 1;
    if (i >= 0) ax.splice(i, 1);
    if (!ax.length) ax = [['data', 1]];
    // the same devices where they divide: the axis that splits the batch gives up what the stages take
    var j = ax.findIndex(function (x) { return x[0] === 'data' || x[0] === 'fsdp'; });
    if (j < 0) j = 0;
    var size = ax[j][1] * old;
    if (size % k === 0) ax[j][1] = size / k;
    if (k > 1) ax.unshift(['stage', k]);   // (where they do not divide, the stages add devices)
    return meshText(ax);
  }
  // The common layouts at n devices (jaxmem/explore/controls.py mesh_presets at any count), each with its layout.
  function presets(n) {
    var roles = meshRoles(), out = [];
    function add(label, mesh, layout) {
      var used = parseMesh(mesh).map(function (a) { return a[0]; });
      if (used.some(function (r) { return roles.indexOf(r) < 0; })) return;
      if (!out.some(function (p) { return p.mesh === mesh; })) out.push({label: label, mesh: mesh, layout: layout});
    }
    add(n === 1 ? 'one GPU' : 'DP', 'data=' + n, n === 1 ? undefined : 'dp');
    if (n > 1) add('FSDP', 'fsdp=' + n, 'fsdp');
    if (n > 8 && n % 8 === 0) add('HSDP', 'data=' + n / 8 + ',fsdp=8', 'fsdp');
    [2, 4, 8].forEach(function (k) { if (n % k === 0 && n > k) add('FSDP+TP' + k, 'fsdp=' + n / k + ',tensor=' + k, 'fsdp_tp'); });
    if (n > 1) add('TP', 'tensor=' + n, 'tp');
    if (n > 1 && n % 2 === 0 && S.info.raw && S.info.raw.seq) add('FSDP+CP2', 'fsdp=' + n / 2 + ',context=2', 'fsdp');
    if (n > 1 && n % 2 === 0) add('PP2', 'stage=2,fsdp=' + n / 2, 'fsdp');
    return out;
  }
  function meshInput(c, id, row) {
    var counts = document.createElement('select');
    counts.id = id;
    counts.title = 'devices: the product of the mesh axes';
    var devWrap = document.createElement('div');
    devWrap.className = 'devices';
    devWrap.appendChild(counts);
    row.appendChild(devWrap);
    row.querySelector('label').textContent = 'devices';
    var pre = document.createElement('div'); pre.className = 'presets';
    var axes = document.createElement('div'); axes.className = 'axes';
    row.appendChild(pre); row.appendChild(axes);
    counts.addEventListener('change', function () {
      var n = Number(counts.value), ax = parseMesh(value('mesh'));
      if (!ax.length) ax = [['data', 1]];
      // keep the layout's other axes; the first axis that splits the batch takes up the rest
      var i = ax.findIndex(function (a) { return a[0] === 'data' || a[0] === 'fsdp'; });
      if (i < 0) i = 0;
      var others = devicesOf(ax) / (ax[i][1] || 1);
      if (n % others === 0) ax[i][1] = n / others; else ax = [[ax[i][0], n]];
      move('mesh', meshText(ax), 0);
    });
  }
  function syncMesh(row) {
    var mesh = value('mesh'), ax = parseMesh(mesh), n = devicesOf(ax);
    var counts = row.querySelector('select');
    var list = (((S.info.mesh || {}).device_counts) || [1, 2, 4, 8, 16, 32, 64, 128, 256]).map(Number);
    if (list.indexOf(n) < 0) list = list.concat([n]).sort(function (a, b) { return a - b; });
    var html = list.map(function (k) { return '<option value="' + k + '">' + k + (k === 1 ? ' GPU' : ' GPUs') + '</option>'; }).join('');
    if (counts.dataset.key !== html) { counts.innerHTML = html; counts.dataset.key = html; }
    counts.value = String(n);
    var pre = row.querySelector('.presets');
    pre.innerHTML = presets(n).map(function (p) {
      return '<button type="button" class="preset' + (p.mesh === mesh ? ' on' : '') + '" data-mesh="' + esc(p.mesh) +
        '"' + (p.layout ? ' data-layout="' + esc(p.layout) + '"' : '') + ' title="--mesh ' + esc(p.mesh) +
        (p.layout ? ' --layout ' + esc(p.layout) : '') + '">' + esc(p.label) + '</button>';
    }).join('');
    pre.querySelectorAll('button').forEach(function (b) {
      b.addEventListener('click', function () {
        var ch = {mesh: b.dataset.mesh};
        if (b.dataset.layout) ch.layout = b.dataset.layout;
        moveMany(ch, 0);
      });
    });
    var box = row.querySelector('.axes');
    var roles = meshRoles();
    box.innerHTML = ax.map(function (a, i) {
      var names = roles.indexOf(a[0]) < 0 ? [a[0]].concat(roles) : roles;
      return '<div class="axis" data-i="' + i + '"><select aria-label="axis ' + (i + 1) + ' role">' +
        names.map(function (r) { return '<option' + (r === a[0] ? ' selected' : '') + '>' + esc(r) + '</option>'; }).join('') +
        '</select><input type="text" inputmode="numeric" value="' + esc(a[1]) + '" aria-label="axis ' + (i + 1) + ' size">' +
        '<button type="button" title="remove this axis"' + (ax.length < 2 ? ' disabled' : '') + '>×</button></div>';
    }).join('') + '<button type="button" class="addaxis">+ axis</button>';
    box.querySelectorAll('.axis').forEach(function (el) {
      var i = Number(el.dataset.i);
      el.querySelector('select').addEventListener('change', function (ev) {
        var a = parseMesh(value('mesh')); a[i][0] = ev.target.value; move('mesh', meshText(a), 0);
      });
      var size = el.querySelector('input');
      size.addEventListener('change', function () {
        var a = parseMesh(value('mesh')); a[i][1] = size.value.trim(); move('mesh', meshText(a), 0);
      });
      size.addEventListener('keydown', function (ev) {
        if (ev.key === 'ArrowUp' || ev.key === 'ArrowDown') {
          ev.preventDefault();
          var a = parseMesh(value('mesh')), s = Number(a[i][1]) || 1;
          a[i][1] = ev.key === 'ArrowUp' ? s * 2 : Math.max(1, Math.floor(s / 2));
          move('mesh', meshText(a), 250);
        }
      });
      el.querySelector('button').addEventListener('click', function () {
        var a = parseMesh(value('mesh')); a.splice(i, 1); move('mesh', meshText(a), 0);
      });
    });
    box.querySelector('.addaxis').addEventListener('click', function () {
      var a = parseMesh(value('mesh'));
      var free = roles.filter(function (r) { return !a.some(function (x) { return x[0] === r; }); });
      if (!free.length) return;
      a.push([free[0], 2]);
      move('mesh', meshText(a), 0);
    });
  }

  // Put the query's values into the controls (after a move elsewhere: a point clicked, a preset, a rescale).
  function syncControls() {
    document.querySelectorAll('#controls .ctl').forEach(function (row) {
      var name = row.dataset.name, c = controlNamed(name), v = value(name);
      if (!c) return;
      if (c.kind === 'mesh') return syncMesh(row);
      if (c.arg && c.arg.config_field) {   // the preset decides what an empty field stands for
        var pv = presetValue(c), label = pv === '' ? 'the preset\'s' : 'preset: ' + pv;
        if (c.kind === 'select') c.none_label = label;
        else if (c.kind !== 'flag') row.querySelector('input').placeholder = label;
      }
      if (c.kind === 'select') return fillSelect(row.querySelector('select'), c, v);
      if (c.kind === 'flag') { row.querySelector('input').checked = v === '1' || v === 'true'; return; }
      var inp = row.querySelector('input');
      if (document.activeElement !== inp || c.kind === 'int') inp.value = v;
    });
    contextWarning();
    // options that only matter beside another are shown muted while that one is off
    var lora = Number(value('lora')) > 0, stage = /(^|,)\s*(stage|pp)\s*=\s*([2-9]|\d\d+)/.test(value('mesh'));
    dim(['lora-targets', 'lora-alpha', 'base-dtype'], !lora);
    dim(['pipeline', 'microbatches', 'repeats', 'stage-remat'], !stage);
  }
  // A sequence past the model's context (a config.json's max_position_embeddings): the model takes it (RoPE) and
  // the memory is that length's, but it was not trained that far -- said beside the control and in the answer
  // (the report's past_context warning says it again once compiled).
  function pastContext(seq) {
    var ctx = S.info && S.info.raw && S.info.raw.context;
    if (!ctx || !ctx.tokens || !(seq > ctx.tokens)) return '';
    return 'sequence length ' + Number(seq).toLocaleString('en-US') + ' is past the model\'s context: its ' + ctx.field +
      ' is ' + Number(ctx.tokens).toLocaleString('en-US') + ' (the memory is that length\'s; the model was not trained that far)';
  }
  function seqOfQuery() {
    var a = seqArg();
    if (!a) return NaN;
    var v = value('arg.' + a);
    return v === '' ? NaN : Number(v);
  }
  function contextWarning() {
    var a = seqArg(), row = a && document.querySelector('#controls .ctl[data-name="arg.' + a + '"]');
    if (!row) return;
    var w = row.querySelector('.warnline'), msg = pastContext(seqOfQuery());
    w.hidden = !msg; w.textContent = msg;
    w.id = 'seq-context-warning';
  }
  function dim(names, off) {
    names.forEach(function (n) {
      var row = document.querySelector('#controls .ctl[data-name="' + n + '"]');
      if (row) row.classList.toggle('off', off);
    });
  }
  function showControlError(name, msg) {
    document.querySelectorAll('#controls .ctl').forEach(function (row) {
      var err = row.querySelector('.err'), mine = msg && row.dataset.name === name;
      err.hidden = !mine; err.textContent = mine ? msg : '';
      row.querySelectorAll('input, select').forEach(function (el) { el.classList.toggle('bad', !!mine); });
    });
  }

  // ------------------------------------------------------------------------------------------- moves
  function move(name, v, delay) {
    var ch = {};
    ch[name] = v;
    moveMany(ch, delay);
  }
  function moveMany(changes, delay) {
    var any = false, gpu = false;
    Object.keys(changes).forEach(function (name) {
      var v = changes[name];
      if (name === 'stages') { name = 'mesh'; v = withStages(value('mesh'), Math.max(1, Number(v) || 1)); }
      if (S.query[name] === v) return;
      S.query[name] = v;
      S.changed = name;
      any = true;
      if (name === 'gpu') gpu = true;
    });
    if (!any) return;
    saveHash();
    if (gpu) { S.info.controls = buildControls(S.info.raw); renderControls(); }   // fp8 comes with the card
    else syncControls();
    clearTimeout(S.timer);
    S.timer = setTimeout(ask, delay === undefined ? 250 : delay);
  }
  function goTo(query) {
    S.query = Object.assign({}, query);
    S.changed = null;
    saveHash();
    syncControls();
    clearTimeout(S.timer);
    ask();
  }
  // The address's fragment is the point on screen (what differs from the start), the points pinned to compare
  // (`pin=`, each what differs from the start, in the fragment's own form) and, once the page has switched
  // models, the model: kept on every move (replaceState: no hashchange), read on load and on every hashchange,
  // so a link reopens the same points and the same comparison.
  function fromStart(q) {
    var diff = {};
    Object.keys(q).forEach(function (k) {
      if (String(q[k]) !== String(S.start[k] === undefined ? '' : S.start[k])) diff[k] = q[k];
    });
    return diff;
  }
  function pinWords() {   // a pinned point is one the server was asked, so it is in S.points
    return S.pins.map(function (k) { return S.points.find(function (p) { return p.key === k; }); })
      .filter(function (p) { return p && p.query; }).map(function (p) { return qs(fromStart(p.query)); });
  }
  function saveHash() {
    var h = qs(fromStart(S.query));
    var pins = pinWords().map(function (w) { return qs({pin: w}); }).join('&');
    if (pins) h = h ? h + '&' + pins : pins;
    if (S.info && S.firstModel !== undefined && S.info.model !== S.firstModel) h = qs({model: S.info.model}) + (h ? '&' + h : '');
    history.replaceState(null, '', location.pathname + location.search + (h ? '#' + h : ''));
  }
  function readHash() {
    var params = new URLSearchParams(location.hash.replace(/^#/, '')), point = {}, model = null, pins = [];
    params.forEach(function (v, k) {
      if (k === 'model') model = v;
      else if (k === 'pin') pins.push(v);
      else point[k] = v;
    });
    return {model: model, point: point, pins: pins.slice(-2)};
  }
  function onHashChange() {
    var h = readHash();
    if (h.model && S.info && h.model !== S.info.model) { switchModel(h.model, h.point, h.pins); return; }
    if (h.pins.join('\n') !== pinWords().join('\n')) restorePins(h.pins);
    var q = Object.assign({}, S.start, h.point);
    if (qs(q) === qs(S.query)) return;
    goTo(q);
  }
  // A link's pinned points: each asked for its exact answer (a compile where the server has none), then pinned
  // and compared as if pinned by hand. A pin the server refuses is dropped with the refusal in a toast.
  function restorePins(words) {
    var gen = S.generation, mine = S.pinSeq = (S.pinSeq || 0) + 1;
    S.pins = [];
    drawCompare();
    if (!words.length) { saveHash(); return; }
    $('compare').innerHTML = '<p class="note" id="pins-loading">opening the link\'s ' + words.length + ' pinned point' +
      (words.length > 1 ? 's' : '') + '…</p>';
    Promise.all(words.map(function (w) {
      var point = {};
      new URLSearchParams(w).forEach(function (v, k) { point[k] = v; });
      var q = Object.assign({}, S.start, point);
      return getJSON(api('answer', q, {wait: 'exact'})).then(function (res) {
        if (!res.ok) { toast('a pinned point was refused: ' + (res.data.error || res.status)); return null; }
        return res.data.key;
      }, function () { return null; });
    })).then(function (got) {
      if (mine !== S.pinSeq || gen !== S.generation) return;   // a newer link or another model since
      got.forEach(function (key) { if (key && S.pins.indexOf(key) < 0) S.pins.push(key); });
      return getJSON(api('points')).then(function (res) {
        if (mine !== S.pinSeq || gen !== S.generation) return;
        if (res.ok && Array.isArray(res.data)) S.points = res.data;
        drawPoints();
        drawCompare();
        saveHash();
      });
    }).catch(function () { toast('the explorer is not answering'); });
  }

  function ask() {
    S.seq += 1;
    clearTimeout(S.poll);
    fetchAnswer(S.seq, Object.assign({}, S.query));
  }
  function fetchAnswer(seq, q) {
    getJSON(api('answer', q)).then(function (res) {
      if (seq !== S.seq) return;
      if (!res.ok) return refused(res.data.error || ('the server answered ' + res.status));
      showControlError(null);
      onAnswer(res.data, seq, q);
    }).catch(function () {
      if (seq === S.seq) S.poll = setTimeout(function () { fetchAnswer(seq, q); }, 1500);
    });
  }
  function onAnswer(d, seq, q) {
    S.history.push({key: d.key, answer: d.answer, at: Date.now()});
    if (S.history.length > 2000) S.history.splice(0, 1000);
    updateCard(d);
    if (d.answer === 'exact') {
      draw(d);
      loadPoints();
      return;
    }
    if (d.answer === 'predicted') {
      S.predictions[d.key] = d.report;
      draw(d);
    } else if (d.answer === 'compiling') {
      compiling(d);
    } else {
      failed(d);
      loadPoints();
      return;
    }
    // poll until the exact answer: briskly at first, then about once a second (a 70B compile takes minutes)
    S.polls = seq === S.pollSeq ? S.polls + 1 : 0;
    S.pollSeq = seq;
    S.poll = setTimeout(function () { fetchAnswer(seq, q); }, Math.min(1200, 400 + 40 * S.polls));
  }

  // --------------------------------------------------------------------------------------- drawing
  function verdictOf(r) {
    if (r.verdict) return r.verdict;
    if (r.fits === true) return 'fits';
    if (r.fits === false) return 'does_not_fit';
    return null;
  }
  function describe(q, base) {
    // a point in a few words: how it differs from `base` (the point on screen, or the start)
    var parts = [];
    Object.keys(q).sort().forEach(function (k) {
      if (String(q[k]) === String(base[k] === undefined ? '' : base[k])) return;
      var name = k.indexOf('arg.') === 0 ? k.slice(4) : k;
      var v = q[k];
      if (v === '1' && controlNamed(k) && controlNamed(k).kind === 'flag') parts.push(name);
      else if (v === '0' && controlNamed(k) && controlNamed(k).kind === 'flag') parts.push('no ' + name);
      else parts.push(name + ' ' + (v === '' ? 'default' : v));
    });
    Object.keys(base).forEach(function (k) {
      if (!(k in q) && base[k] !== '' && base[k] !== undefined) parts.push((k.indexOf('arg.') === 0 ? k.slice(4) : k) + ' default');
    });
    return parts;
  }

  function draw(d) {
    var r = d.report, pred = d.answer === 'predicted';
    var ans = $('answer');
    ans.classList.remove('stale', 'refused');
    ans.dataset.answer = d.answer;
    ans.dataset.key = d.key || '';
    var peak = r.per_device_peak_bytes, t = r.target || {};
    $('peak').textContent = fmtBytes(peak);
    $('peak').dataset.bytes = String(peak);
    $('peak-sub').textContent = pred ? 'per-device peak, predicted' :
      'per-device peak (' + Number(peak).toLocaleString('en-US') + ' bytes)';
    var v = verdictOf(r), vb = $('verdict'), vt = verdictWords(v) || ['NO FIXED LIMIT', 'na'];
    vb.textContent = vt[0]; vb.className = 'badge ' + vt[1]; vb.dataset.verdict = v || '';
    var st = $('state');
    st.textContent = pred ? 'prediction' : 'exact';
    st.className = 'state ' + (pred ? 'predicted' : 'exact');
    st.title = pred ? 'predicted from compiled neighbours; the exact compile is running' :
      'XLA compiled this point: the numbers are analyze --json\'s';
    $('facts').innerHTML = facts(r, v);
    $('bar').innerHTML = bar(r);
    $('legend').innerHTML = legend(r);
    $('steptime').innerHTML = stepTime(r, d.tokens_per_s);
    $('details').innerHTML = details(r, pred);
    $('command').textContent = d.command || '';
    var lines = '';
    if (pred) {
      var from = (r.predicted_from || []).map(function (q) { return describe(q, S.query).join(', ') || 'this point'; });
      lines = '<div class="predline" id="prediction"><b>Prediction</b> from the compiled point' +
        (from.length === 1 ? ' ' : 's ') + from.map(function (f) { return '<b>' + esc(f) + '</b>'; }).join(' and ') +
        (r.prediction && r.prediction.kind ? ' (' + esc(r.prediction.curve || 'fitted') + ' in ' +
          esc(r.prediction.kind === 'seq' ? 'sequence length' : r.prediction.kind) + ')' : '') +
        '. The exact compile is running and replaces it when it lands.</div>';
    } else if (d.prediction || S.predictions[d.key]) {
      // the exact answer replaced a prediction: say how far it was (the server's record, else the page's)
      var p = d.prediction || S.predictions[d.key], off = p.per_device_peak_bytes - peak;
      var pct = peak ? 100 * Math.abs(off) / peak : 0;
      var src = (p.predicted_from || []).map(function (q) { return describe(q, S.query).join(', ') || 'this point'; });
      lines = '<div class="predline landed" id="prediction-check" data-predicted="' + p.per_device_peak_bytes +
        '" data-exact="' + peak + '">The exact compile replaced the prediction' +
        (src.length ? ' (from ' + src.map(esc).join(' and ') + ')' : '') + ': it was <b>' +
        esc(fmtBytes(p.per_device_peak_bytes)) + '</b>, ' + (off === 0 ? 'exactly right' : esc(fmtBytes(Math.abs(off))) +
        (off > 0 ? ' high' : ' low') + ' (' + pyFixed(pct, 2) + '%)') + '.</div>';
    }
    $('status-lines').innerHTML = lines;
    var exact = !pred;
    ['json', 'html', 'png'].forEach(function (f) {
      var a = $('save-' + f);
      a.href = api('save', S.query, {format: f, token: TOKEN});
      a.classList.toggle('disabled', !exact);
    });
    if (exact) buffers(r);
    else $('buffers').innerHTML = '<p class="note">They come with the exact compile.</p>';
    S.shown = d;
    markCurrent();
    if (r.model) { $('model').textContent = r.model; document.title = 'jaxmem · explore · ' + r.model; }
    // the model's own sequence length, where the point leaves it to the model
    var seqArg = S.info.raw && S.info.raw.seq && S.info.raw.seq.arg;
    var seqInput = seqArg && document.querySelector('#controls .ctl[data-name="arg.' + seqArg + '"] input');
    if (seqInput && r.sequence_length) seqInput.placeholder = r.sequence_length + ' (model)';
  }

  // What the report says beyond the bar, drawn from whatever keys it has: the parameter counts, the memory
  // fractions it fits at (fraction_floor / fraction_ceiling), its warnings, and its choices with their sources.
  function count(n) {
    if (n === null || n === undefined) return '-';
    var a = Math.abs(n);
    return a >= 1e9 ? pyFixed(n / 1e9, 2) + ' B' : a >= 1e6 ? pyFixed(n / 1e6, 2) + ' M' :
      a >= 1e3 ? pyFixed(n / 1e3, 1) + ' K' : String(n);
  }
  function details(r, pred) {
    var out = [];
    if (r.param_count !== undefined && r.param_count !== null) {
      var parts = '<span>parameters <b id="params-total">' + esc(count(r.param_count)) + '</b></span>';
      if (r.trainable_param_count !== null && r.trainable_param_count !== undefined) {
        parts += '<span>trainable <b id="params-trainable">' + esc(count(r.trainable_param_count)) + '</b></span>' +
          '<span>frozen <b id="params-frozen">' + esc(count(r.frozen_param_count || 0)) + '</b></span>';
      }
      out.push('<p class="facts" id="params" title="' + esc(Number(r.param_count).toLocaleString('en-US')) + ' parameters">' + parts + '</p>');
    }
    var lo = r.fraction_floor, hi = r.fraction_ceiling;
    if (lo !== undefined && lo !== null && hi !== undefined && hi !== null) {
      out.push('<p class="band" id="fraction-band">' + (lo > hi ? 'no memory fraction fits (the pool needs ' + esc(lo) +
        ' of the card, the card leaves ' + esc(hi) + ')' : 'fits with XLA_PYTHON_CLIENT_MEM_FRACTION between <b>' +
        esc(lo) + '</b> and <b>' + esc(hi) + '</b>') + '</p>');
    }
    var warns = (r.warnings || []).map(function (w) { return {kind: w.kind, message: w.message}; });
    var ctx = pastContext(r.sequence_length);
    if (ctx && !warns.some(function (w) { return w.kind === 'past_context'; })) warns.unshift({kind: 'past_context', message: ctx});
    if (warns.length) {
      out.push('<ul class="warnings" id="warnings">' + warns.map(function (w) {
        return '<li data-kind="' + esc(w.kind) + '" title="' + esc(((schema().warning_kinds || {})[w.kind]) || '') + '"><b>' +
          esc(w.kind) + '</b> ' + esc(w.message) + '</li>';
      }).join('') + '</ul>');
    }
    var ch = r.choices || {}, src = ch.sources || {}, names = Object.keys(ch).filter(function (k) {
      return k !== 'sources' && !/_why$/.test(k) && ch[k] !== null && ch[k] !== undefined && typeof ch[k] !== 'object';
    });
    if (names.length) {
      out.push('<details class="choices" id="choices"' + (S.choicesOpen ? ' open' : '') + '><summary>choices' + (pred ? ' (the compiled neighbour\'s)' : '') +
        ': ' + esc(names.length) + '</summary><dl>' + names.map(function (k) {
          return '<div data-choice="' + esc(k) + '" title="' + esc(ch[k + '_why'] || '') + '"><dt>' + esc(k.replace(/_/g, ' ')) +
            '</dt><dd>' + esc(ch[k]) + (src[k] ? ' <span class="src src-' + esc(src[k]) + '">' + esc(src[k]) + '</span>' : '') +
            '</dd></div>';
        }).join('') + '</dl></details>');
    }
    return out.join('');
  }

  function facts(r, v) {
    var t = r.target || {}, out = [];
    if (t.usable_bytes === null || t.usable_bytes === undefined) return '<span>' + esc(t.usable_note || 'no fixed limit') + '</span>';
    var head = r.headroom_bytes !== undefined && r.headroom_bytes !== null ? r.headroom_bytes : t.usable_bytes - r.per_device_peak_bytes;
    out.push('<span>usable <b>' + esc(fmtBytes(t.usable_bytes)) + '</b> of ' + esc(fmtBytes(t.memory_bytes)) + '</span>');
    out.push('<span>headroom <b id="headroom" class="' + (head >= 0 ? 'pos' : 'neg') + '">' + esc(fmtBytes(head)) + '</b></span>');
    if (r.margin_bytes !== undefined && r.margin_bytes !== null) {
      out.push('<span title="bytes to spare in the tighter constraint (JAX\'s pool, or the card with the runtime ' +
        'outside it) at the estimates">margin <b id="margin" class="' + (r.margin_bytes >= 0 ? 'pos' : 'neg') + '">' +
        esc(fmtBytes(r.margin_bytes)) + '</b></span>');
    }
    if (v === 'tight' && r.verdict_terms && r.verdict_terms.length) {
      out.push('<span>hangs on <b>' + esc(r.verdict_terms.map(function (x) {
        return x.name + ' ' + fmtBytes(x.low_bytes) + '-' + fmtBytes(x.high_bytes);
      }).join(', ')) + '</b></span>');
    }
    var line = out.join('');
    var devs = t.devices ? (t.devices + ' × ' + (t.description || t.gpu)) : '';
    return line + (devs ? '<br><span class="note">' + esc(devs) + (t.hosts > 1 ? ', ' + t.hosts + ' hosts' : '') +
      (r.mesh ? ' · mesh ' + esc(Object.keys(r.mesh).map(function (k) { return k + '=' + r.mesh[k]; }).join(',')) : '') +
      (t.usable_note ? ' · ' + esc(t.usable_note) : '') + '</span>' : '');
  }

  function groups(r) {   // the parts drawn: every part of the breakdown that holds bytes, in the schema's order
    return partsOf(r).map(function (g, i) { g.color = colorOf(g.key, i); return g; })
      .filter(function (g) { return g.bytes > 0; });
  }
  function stack(r, scale, minLabel) {
    var html = '<div class="stack">';
    groups(r).forEach(function (g) {
      if (g.bytes <= 0) return;
      var w = 100 * g.bytes / scale, lab = w >= minLabel ? esc(g.label) : '';
      html += '<div' + (lab ? '' : ' class="thin"') + ' data-part="' + g.key + '" style="width:' + w.toFixed(4) +
        '%;background:' + g.color + '" title="' + esc(g.label + ': ' + fmtBytes(g.bytes)) +
        (g.help ? ' (' + esc(g.help) + ')' : '') + '">' + lab + '</div>';
    });
    return html + '</div>';
  }
  // The per-device bar against the card (usable and card marked), and under it the same parts at the peak's
  // own scale, so a step that uses 1% of the card still shows what its peak is made of.
  function bar(r) {
    var t = r.target || {}, peak = r.per_device_peak_bytes;
    var card = t.memory_bytes || t.usable_bytes || peak;
    var scale = Math.max(card, peak, 1);
    var html = '<div class="bar" title="per-device peak ' + esc(fmtBytes(peak)) + ' against the card">' + stack(r, scale, 9);
    function mark(cls, at, text) {
      var pct = 100 * at / scale, side = pct > 30 ? 'left' : 'right';
      var left = pct > 99.5 ? 'calc(' + pct.toFixed(3) + '% - 2px)' : pct.toFixed(3) + '%';
      return '<div class="mark ' + cls + '" style="left:' + left + '"></div>' +
        '<div class="marklab ' + cls + ' ' + side + '" style="left:' + left + '">' + esc(text) + '</div>';
    }
    if (t.usable_bytes) html += mark('m-usable', t.usable_bytes, 'usable ' + fmtBytes(t.usable_bytes));
    if (t.memory_bytes && t.memory_bytes !== t.usable_bytes) html += mark('m-card', t.memory_bytes, 'card ' + fmtBytes(t.memory_bytes));
    html += '</div>';
    if (peak < 0.5 * scale) {
      html += '<div class="zoom"><span class="cap">the peak alone</span>' + stack(r, Math.max(peak, 1), 7) + '</div>';
    }
    return html;
  }
  function legend(r) {
    var peak = r.per_device_peak_bytes;
    return groups(r).map(function (g) {
      return '<span data-part="' + esc(g.key) + '"' + (g.help ? ' title="' + esc(g.help) + '"' : '') + '>' +
        '<span class="sw" style="background:' + g.color + '"></span>' + esc(g.label) + ' <b class="bytes">' +
        esc(fmtBytes(g.bytes)) + '</b> <span class="share">' + share(g.bytes, peak) + '</span></span>';
    }).join('');
  }
  function stepTime(r, tokens) {
    var st = r.step_time || {};
    if (!st.available && st.estimate_s === undefined) {
      return 'step time: no estimate (' + esc(st.reason || 'unavailable') + ')';
    }
    var t = r.target || {}, devices = t.devices || 1;
    var batch = Number((r.options || {}).batch);
    var html = 'step time (estimate) <b id="step">' + esc(fmtSeconds(st.estimate_s)) + '</b>';
    if (st.low_s !== undefined) html += ', band <span id="band">' + esc(fmtSeconds(st.low_s)) + '-' + esc(fmtSeconds(st.high_s)) + '</span>';
    if (st.bound) html += ' <span class="note">(' + esc(st.bound) + '-bound)</span>';
    if (tokens) {
      html += ' · <b id="rate">' + fmtRate(tokens) + '</b> tokens/s per device';
    } else if (batch > 0 && st.estimate_s > 0 && st.available !== false) {
      html += ' · <b id="rate">' + fmtRate(batch / devices / st.estimate_s) + '</b> samples/s per device';
    }
    return html;
  }
  function buffers(r) {
    var bs = r.top_buffers || [];
    if (!bs.length) { $('buffers').innerHTML = '<p class="note">No buffers listed (run without --no-explain).</p>'; return; }
    var live = 0;
    Object.keys(r.peak_categories || {}).forEach(function (k) { live += r.peak_categories[k]; });
    var biggest = Math.max.apply(null, bs.map(function (b) { return b.size; })) || 1;
    var rows = bs.slice(0, 12).map(function (b) {
      var c = colorOf(b.category);
      return '<tr title="' + esc(b.op_name || b.instruction) + '"><td class="num">' + esc(fmtBytes(b.size)) + '</td>' +
        '<td class="barcell"><div class="minibar" style="width:max(2px,' + (100 * b.size / biggest).toFixed(2) + '%);background:' + c + '"></div></td>' +
        '<td class="mono">' + esc(b.dtype) + esc(b.shape) + '</td>' +
        '<td><span class="cat" style="background:' + c + '33;border:1px solid ' + c + '">' + esc(b.category) + '</span></td>' +
        '<td class="mono path">' + esc(b.module_path || '-') + '</td></tr>';
    }).join('');
    $('buffers').innerHTML = '<p class="note">Of the ' + esc(fmtBytes(live)) + ' live at the peak; hover a row for its op.</p>' +
      '<table><thead><tr><th class="num">bytes</th><th></th><th>dtype · shape</th><th>category</th><th>module</th></tr></thead>' +
      '<tbody>' + rows + '</tbody></table>';
  }

  function compiling(d) {
    $('answer').classList.remove('refused');
    $('answer').classList.add('stale');
    $('answer').dataset.answer = 'compiling';
    var st = $('state');
    st.textContent = 'compiling'; st.className = 'state compiling';
    // the server's eta_s is the time left (the median compile so far, less what this one has run)
    var p = d.progress || {}, left = p.eta_s === null || p.eta_s === undefined ? NaN : Number(p.eta_s);
    var el = Number(p.elapsed_s) || 0;
    var text = !isFinite(left) ? 'compiling (the first compile: no estimate yet; ' + Math.round(el) + ' s so far)' :
      'compiling (about ' + Math.max(1, Math.round(left)) + ' s)' + (p.queued_before ? ', ' + p.queued_before + ' ahead in the queue' : '');
    var frac = isFinite(left) ? Math.min(0.97, el / Math.max(el + left, 0.001)) : Math.min(0.9, el / (el + 10));
    var old = $('compiling');
    if (!old) {
      $('status-lines').innerHTML = '<div class="progress" id="compiling"><span></span><div class="track"><div></div></div></div>';
      old = $('compiling');
    }
    old.querySelector('span').textContent = text + (S.shown ? ' — the answer below is the previous point\'s' : '');
    old.querySelector('.track div').style.width = (100 * frac).toFixed(1) + '%';
    $('command').textContent = d.command || $('command').textContent;
    ['json', 'html', 'png'].forEach(function (f) { $('save-' + f).classList.add('disabled'); });
  }
  function failed(d) {
    $('answer').classList.remove('refused');
    $('answer').classList.add('stale');
    $('answer').dataset.answer = 'error';
    var st = $('state');
    st.textContent = 'error'; st.className = 'state error';
    $('status-lines').innerHTML = '<div class="errline" id="error">' + esc(d.error || 'the compile failed') + '</div>';
    $('command').textContent = d.command || $('command').textContent;
    ['json', 'html', 'png'].forEach(function (f) { $('save-' + f).classList.add('disabled'); });
  }
  function refused(msg) {
    S.history.push({key: null, answer: 'refused', at: Date.now()});
    $('answer').classList.add('stale', 'refused');
    $('answer').dataset.answer = 'refused';
    var st = $('state');
    st.textContent = 'not a valid point'; st.className = 'state error';
    $('status-lines').innerHTML = '<div class="errline" id="error">' + esc(msg) + '</div>';
    showControlError(S.changed, msg);
    ['json', 'html', 'png'].forEach(function (f) { $('save-' + f).classList.add('disabled'); });
  }

  // ----------------------------------------------------------------------------------------- points
  function loadPoints() {
    var mine = S.pointsSeq = (S.pointsSeq || 0) + 1, gen = S.generation;
    getJSON(api('points')).then(function (res) {
      // an older request's list (or the model before a switch) never replaces a newer one
      if (mine !== S.pointsSeq || gen !== S.generation) return;
      if (res.ok && Array.isArray(res.data)) { S.points = res.data; drawPoints(); }
    }).catch(function () {});
  }
  function drawPoints() {
    var strip = $('strip');
    var pts = S.points;
    if (!pts.length) { strip.innerHTML = '<span class="empty">none yet</span>'; return; }
    var top = Math.max.apply(null, pts.map(function (p) { return p.peak || 0; })) || 1;
    var labels = stripLabels(pts);
    strip.innerHTML = pts.map(function (p, i) {
      var label = labels[i];
      var pinned = S.pins.indexOf(p.key) >= 0;
      var v = p.answer === 'error' ? 'error' : p.verdict || 'none';
      var meta = p.answer === 'compiling' ? 'compiling…' : p.answer === 'error' ? 'error: ' + (p.error || '') :
        (p.answer === 'predicted' ? 'predicted · ' : '') +
        (p.step_time ? fmtSeconds(p.step_time) + ' / step' : '') +
        (p.tokens_per_s ? ' · ' + fmtRate(p.tokens_per_s) + ' tok/s' : '');
      return '<div class="pt' + (pinned ? ' pinned' : '') + ' a-' + esc(p.answer) + '" data-key="' + esc(p.key) + '" title="' + esc(label) + '">' +
        '<button class="pin" title="pin to compare (two at a time)" aria-label="pin">' + (pinned ? '◆' : '◇') + '</button>' +
        '<div class="lab">' + esc(label) + '</div>' +
        '<div class="pk"><span class="dot ' + esc(v) + '"></span>' + (p.peak === null || p.peak === undefined ? (p.answer === 'error' ? 'error' : '…') : esc(fmtBytes(p.peak))) + '</div>' +
        '<div class="mini"><div style="width:' + (100 * (p.peak || 0) / top).toFixed(1) + '%;background:' +
        (v === 'does_not_fit' ? 'var(--bad)' : v === 'tight' ? 'var(--warn)' : 'var(--accent)') + '"></div></div>' +
        '<div class="meta">' + esc(meta) + '</div></div>';
    }).join('');
    strip.querySelectorAll('.pt').forEach(function (el) {
      var p = pts.find(function (x) { return x.key === el.dataset.key; });
      el.addEventListener('click', function (ev) {
        if (ev.target.classList.contains('pin')) { pin(p.key); ev.stopPropagation(); return; }
        goTo(p.query);
      });
    });
    markCurrent();
  }
  // Each card's label: what differs from the starting point, the words no other card shares first (two cards
  // "seq_len 3072, base-dtype nf4, batch 4" and "... batch 8" lead with "batch 4" and "batch 8").
  function stripLabels(pts) {
    var words = pts.map(function (p) { return describe(p.query || {}, S.start); });
    var seen = {};
    words.forEach(function (ws) { ws.forEach(function (w) { seen[w] = (seen[w] || 0) + 1; }); });
    return words.map(function (ws) {
      if (!ws.length) return 'the starting point';
      var own = ws.filter(function (w) { return seen[w] < pts.length; });
      var shared = ws.filter(function (w) { return seen[w] >= pts.length; });
      return own.concat(shared).join(', ');
    });
  }
  // The card of the point an answer is for, updated from that answer at once (not at the next poll of the list)
  function updateCard(d) {
    if (!d.key || d.answer === 'compiling') return;
    var r = d.report || {}, st = r.step_time || {};
    var row = {key: d.key, query: d.query || S.query, answer: d.answer, command: d.command,
      peak: d.report ? r.per_device_peak_bytes : null, verdict: d.report ? verdictOf(r) : null,
      step_time: st.available ? st.estimate_s : null, tokens_per_s: d.tokens_per_s || null, error: d.error || null};
    var i = S.points.findIndex(function (p) { return p.key === d.key; });
    if (i >= 0) S.points[i] = Object.assign({}, S.points[i], row);
    else S.points.push(row);
    drawPoints();
  }
  function markCurrent() {
    var key = S.shown && S.shown.key;
    var strip = $('strip');
    document.querySelectorAll('#strip .pt').forEach(function (el) {
      var on = el.dataset.key === key;
      el.classList.toggle('current', on);
      // keep the point on screen in view within the strip (the strip alone scrolls, never the page)
      if (on && (el.offsetLeft + el.offsetWidth > strip.scrollLeft + strip.clientWidth || el.offsetLeft < strip.scrollLeft)) {
        strip.scrollLeft = Math.max(0, el.offsetLeft - (strip.clientWidth - el.offsetWidth) / 2);
      }
    });
  }
  function pin(key) {
    var i = S.pins.indexOf(key);
    if (i >= 0) S.pins.splice(i, 1);
    else { S.pins.push(key); if (S.pins.length > 2) S.pins.shift(); }
    drawPoints();
    drawCompare();
    saveHash();
  }
  function drawCompare() {
    var box = $('compare');
    if (S.pins.length < 2) {
      box.innerHTML = S.pins.length ? '<p class="note">Pin one more point to compare the two side by side.</p>' : '';
      return;
    }
    var ps = S.pins.map(function (k) { return S.points.find(function (p) { return p.key === k; }); });
    if (!ps[0] || !ps[1]) { box.innerHTML = ''; return; }
    Promise.all(ps.map(function (p) { return getJSON(api('answer', p.query)); })).then(function (res) {
      var a = res[0].data.report, b = res[1].data.report;
      if (!a || !b) { box.innerHTML = '<p class="note">Both points need their exact answer to compare.</p>'; return; }
      var la = describe(ps[0].query, S.start).join(', ') || 'the starting point';
      var lb = describe(ps[1].query, S.start).join(', ') || 'the starting point';
      var rows = [];
      function row(name, x, y, fmt, delta, part) {
        var dv = delta === false ? '' : (y - x === 0 ? '=' : (y > x ? '+' : '−') + fmt(Math.abs(y - x)));
        rows.push('<tr' + (part ? ' data-part="' + esc(part) + '"' : '') + '><td>' + esc(name) + '</td><td class="num">' + esc(fmt(x)) + '</td><td class="num">' + esc(fmt(y)) +
          '</td><td class="num delta">' + esc(dv) + '</td></tr>');
      }
      describe(ps[1].query, ps[0].query).forEach(function (w) { rows.push('<tr><td colspan="4" class="note">B: ' + esc(w) + '</td></tr>'); });
      row('per-device peak', a.per_device_peak_bytes, b.per_device_peak_bytes, fmtBytes);
      (schema().breakdown || []).map(function (x) { return x.key; }).forEach(function (k) {
        var x = (a.breakdown || {})[k], y = (b.breakdown || {})[k];
        if (x || y) row('  ' + k, x || 0, y || 0, fmtBytes, undefined, k);
      });
      rows.push('<tr><td>verdict</td><td class="num">' + esc((verdictWords(verdictOf(a)) || ['-'])[0]) + '</td><td class="num">' +
        esc((verdictWords(verdictOf(b)) || ['-'])[0]) + '</td><td></td></tr>');
      var sa = (a.step_time || {}).estimate_s, sb = (b.step_time || {}).estimate_s;
      if (sa && sb) row('step time (estimate)', sa, sb, fmtSeconds);
      box.innerHTML = '<table><thead><tr><th></th><th class="num">A: ' + esc(la) + '</th><th class="num">B: ' + esc(lb) +
        '</th><th class="num">B − A</th></tr></thead><tbody>' + rows.join('') + '</tbody></table>';
    }).catch(function () {});
  }

  // --------------------------------------------------------------------------------- advise and fit
  // A candidate's command line back into a query: the page moves there when "try" is clicked.
  function shellWords(s) {
    var out = [], cur = '', q = null, any = false;
    for (var i = 0; i < s.length; i++) {
      var ch = s[i];
      if (q) { if (ch === q) q = null; else cur += ch; continue; }
      if (ch === "'" || ch === '"') { q = ch; any = true; continue; }
      if (ch === ' ') { if (cur || any) out.push(cur); cur = ''; any = false; continue; }
      cur += ch;
    }
    if (cur || any) out.push(cur);
    return out;
  }
  function queryOf(command) {
    var w = shellWords(command), q = {};
    while (w.length && /^[A-Z_]+=/.test(w[0])) {   // a memory fraction set in front of the command
      var env = w.shift().split('=');
      if (/MEM_FRACTION$/.test(env[0])) q['mem-fraction'] = env[1];
    }
    Object.keys(S.query).forEach(function (k) { q[k] = S.query[k]; });
    for (var i = 3; i < w.length; i++) {
      if (w[i].indexOf('--') !== 0) continue;
      var name = w[i].slice(2), c = controlNamed(name);
      if (name === 'no-explain' || name === 'json') continue;
      if (name === 'arg') { var kv = w[++i].split('='); q['arg.' + kv[0]] = kv.slice(1).join('='); continue; }
      var next = w[i + 1];
      if ((c && c.kind === 'flag') || next === undefined || next.indexOf('--') === 0) { q[name] = '1'; continue; }
      q[name] = next; i++;
    }
    return q;
  }
  // /api/advise and /api/fit run in the background on the server: {status: running | done | error, advice | fit}
  function background(route, q, box, draw, pollName) {
    clearTimeout(S[pollName]);
    (function poll() {
      getJSON(api(route, q)).then(function (res) {
        var d = res.data;
        if (!res.ok || d.status === 'error' || d.answer === 'error') {
          box.innerHTML = '<div class="errline">' + esc(d.error || 'failed') + '</div>';
          return;
        }
        if (d.status === 'running' || d.answer === 'compiling') {
          if (d.status === 'running' && d.advice) draw(d);   // advise's snapshot: predicted rows, then exact ones
          S[pollName] = setTimeout(poll, 1500); return;
        }
        draw(d);
      }).catch(function () { S[pollName] = setTimeout(poll, 3000); });
    })();
  }
  function runAdvise() {
    $('advise-card').hidden = false;
    $('advise').innerHTML = '<p class="progress">running jaxmem advise: it compiles each candidate change…</p>';
    background('advise', Object.assign({}, S.query), $('advise'), function (d) { drawAdvise(d.advice || d); }, 'advisePoll');
  }
  // advise's rows: the plans that fit on the GPUs as given, those that need more GPUs, those that do not fit;
  // each predicted until its compile lands (status), with "N of M compiled, about S s left" while it runs
  function drawAdvise(d) {
    var cs = d.candidates || [], prog = d.progress || {}, orig = d.original || {};
    var head = '<p class="note">' + (d.done === false ? '<span class="progress">' + esc(prog.text || 'compiling') +
      '</span> · predicted rows are replaced by their compile as it lands. ' : esc(prog.text || '') + '. ') +
      'Step time relative to the point as given (' + esc(fmtSeconds(orig.step_time_estimate_s)) + ').</p>';
    var lists = [['given_gpus', 'Plans that fit on the GPUs you have, highest throughput per device first'],
                 ['more_gpus', 'Plans that fit only with more GPUs (each says how many it needs)'],
                 ['does_not_fit', 'Compiled plans that do not fit']];
    var html = head, any = false;
    lists.forEach(function (l) {
      var rows = cs.filter(function (c) { return c.section === l[0]; });
      if (!rows.length) return;
      any = true;
      html += '<h3>' + esc(l[1]) + '</h3><table><thead><tr><th class="num">#</th><th>plan</th><th class="num">peak</th>' +
        '<th class="num">step</th><th>as a command</th><th></th></tr></thead><tbody>' + rows.map(function (c) {
          var v = c.verdict || (c.fits ? 'fits' : 'does_not_fit'), i = cs.indexOf(c);
          var badge = c.status === 'predicted' ? ' <span class="badge predicted">predicted</span>' : '';
          return '<tr><td class="num">' + (c.rank || '-') + '</td><td>' + esc(c.label) + badge + '</td><td class="num">' +
            '<span class="dot ' + esc(v) + '"></span>' + esc(fmtBytes(c.per_device_peak_bytes)) + '</td><td class="num">' +
            (c.relative_step_time ? '×' + pyFixed(c.relative_step_time, 2) : '-') + '</td>' +
            '<td class="mono path note">' + esc(c.command.replace(/^(\S+=\S+ )*jaxmem analyze \S+ /, '')) + '</td>' +
            '<td><button class="btn go" data-i="' + i + '" title="' + esc(c.command) + '">try</button></td></tr>';
        }).join('') + '</tbody></table>';
    });
    if (!any) html += '<p class="note">' + (d.done === false ? 'Nothing ranked yet.' : 'No change advise tries fits.') + '</p>';
    $('advise').innerHTML = html;
    $('advise').querySelectorAll('button.go').forEach(function (b) {
      b.addEventListener('click', function () { goTo(queryOf(cs[Number(b.dataset.i)].command)); });
    });
  }
  function runFit() {
    $('fit-card').hidden = false;
    $('fit').innerHTML = '<p class="progress">searching: a few compiles fit memory\'s curve, then the boundary is proved…</p>';
    background('fit', Object.assign({}, S.query), $('fit'), function (d) {
      var f = d.fit || d, b = f.max_batch !== undefined ? f.max_batch : f.batch;
      if (b === null || b === undefined) {
        $('fit').innerHTML = '<p>' + esc(f.error || 'No batch fits on this card and mesh.') + '</p>';
        return;
      }
      var margin = f.margin !== undefined && f.margin !== null ? ' keeping ' + pyFixed(100 * f.margin, 0) + '% of usable memory free' : '';
      $('fit').innerHTML = '<p>The largest global batch that fits' + esc(margin) + ': <b id="fit-batch" style="font-size:20px">' +
        esc(b) + '</b>' + (f.capped ? ' <span class="note">(the search\'s cap: larger may fit too)</span>' : '') +
        '<br><span class="note">proved: it fits, and the next step up does not.</span></p>' +
        '<button class="btn primary" id="fit-go">go to batch ' + esc(b) + '</button>';
      $('fit-go').addEventListener('click', function () { move('batch', String(b), 0); });
    }, 'fitPoll');
  }

  function runFitSeq() {
    $('fit-seq-card').hidden = false;
    $('fit-seq').innerHTML = '<p class="progress">searching: a few compiles fit memory\'s curve in the sequence, then the ' +
      'boundary is proved…</p>';
    background('fit_seq', Object.assign({}, S.query), $('fit-seq'), function (d) {
      var f = d.fit_seq || d, t = f.max_seq, arg = f.arg || seqArg();
      if (t === null || t === undefined || t === 0) {
        $('fit-seq').innerHTML = '<p>' + esc(f.error || 'No sequence length fits at this batch on this card and mesh.') + '</p>';
        return;
      }
      var warn = pastContext(t);
      $('fit-seq').innerHTML = '<p>The longest ' + esc(arg) + ' that fits at this batch: <b id="fit-seq-answer" style="font-size:20px">' +
        esc(Number(t).toLocaleString('en-US')) + '</b>' + (f.capped ? ' <span class="note">(the search\'s cap: longer may fit too)</span>' : '') +
        '<br><span class="note">proved: it fits, and the next step up does not (steps of ' +
        esc((f.search || {}).granule || '') + ' tokens).</span></p>' + (warn ? '<p class="warnline">' + esc(warn) + '</p>' : '') +
        '<button class="btn primary" id="fit-seq-go">go to ' + esc(arg) + ' ' + esc(t) + '</button>';
      $('fit-seq-go').addEventListener('click', function () { move('arg.' + arg, String(t), 0); });
    }, 'fitSeqPoll');
  }

  // ----------------------------------------------------------------------------------- the model picker
  function loadModels() {
    getJSON(api('models')).then(function (res) { if (res.ok) { S.models = res.data; drawPicker(); } }).catch(function () {});
  }
  function drawPicker() {
    var d = S.models || {}, cur = S.info ? S.info.model : '', listed = {};
    function opt(path, label) {
      listed[path] = true;
      return '<option value="' + esc(path) + '"' + (path === cur ? ' selected' : '') + '>' + esc(label) + '</option>';
    }
    var found = (d.found || []).map(function (m) { return opt(m.path, m.path); }).join('');
    var shipped = (d.shipped || []).map(function (m) { return opt(m.path, m.label + ' (shipped)'); }).join('');
    $('model-pick').innerHTML = (listed[cur] ? '' : opt(cur, cur)) +
      (found ? '<optgroup label="under the starting folder">' + found + '</optgroup>' : '') +
      (shipped ? '<optgroup label="config.json files jaxmem ships">' + shipped + '</optgroup>' : '');
    $('model-pick').value = cur;
  }
  // Another model, on the same server and workers: its controls replace these, its start is the new point.
  function switchModel(path, point, pins) {
    if (!path || (S.info && path === S.info.model && !point)) return;
    $('picker').classList.remove('bad');
    $('picker').title = '';
    $('answer').classList.add('stale');
    $('status-lines').innerHTML = '<div class="progress" id="switching">opening ' + esc(path) + '…</div>';
    getJSON(api('model', {path: path})).then(function (res) {
      if (!res.ok) {
        $('picker').classList.add('bad');
        $('status-lines').innerHTML = '<div class="errline" id="model-error">' + esc(res.data.error || 'refused') + '</div>';
        if (!S.info || !S.info.controls || !Object.keys(S.start || {}).length) {   // a link's model refused at load
          getJSON(api('controls')).then(function (r) { if (r.ok) applyControls(r.data, {}); });
        }
        drawPicker();
        return;
      }
      applyControls(res.data, point || {}, pins);
    }).catch(function () { toast('the explorer is not answering'); });
  }
  function applyControls(data, point, pins) {
    S.generation = data.generation;
    S.start = Object.assign({}, data.start || {});
    S.query = Object.assign({}, S.start, point || {});
    S.info = normalize(data);
    if (S.firstModel === undefined) S.firstModel = data.model;
    S.points = []; S.pins = []; S.predictions = {}; S.shown = null;
    var name = data.model || '';
    $('model').textContent = name.split('/').pop() || name;
    $('source').textContent = name + ' — per-device memory of one training step, compiled for each point';
    document.title = 'jaxmem · explore · ' + (name.split('/').pop() || name);
    $('fit-seq-btn').hidden = !data.seq_arg;
    ['fit-card', 'fit-seq-card', 'advise-card'].forEach(function (id) { $(id).hidden = true; });
    renderControls();
    drawPicker();
    drawPoints();
    drawCompare();
    saveHash();
    ask();
    loadPoints();
    if (pins && pins.length) restorePins(pins);
  }

  // ------------------------------------------------------------------------------------------ start
  function copyCommand() {
    var text = $('command').textContent;
    function done() { toast('copied: ' + (text.length > 60 ? text.slice(0, 57) + '…' : text)); }
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, fallback);
    } else fallback();
    function fallback() {
      var ta = document.createElement('textarea');
      ta.value = text; document.body.appendChild(ta); ta.select();
      try { document.execCommand('copy'); done(); } catch (e) { toast('select the command and copy it'); }
      document.body.removeChild(ta);
    }
  }
  function boot() {
    var h = readHash();
    getJSON(api('controls')).then(function (res) {
      if (!res.ok) { $('controls').innerHTML = '<div class="errline">' + esc(res.data.error) + '</div>'; return; }
      if (h.model && h.model !== res.data.model) {   // a link to another model than the one the server shows
        S.firstModel = res.data.model;
        S.info = normalize(res.data);
        switchModel(h.model, h.point, h.pins);
      } else applyControls(res.data, h.point, h.pins);
      loadModels();
      setInterval(loadPoints, 2500);
    }).catch(function () { setTimeout(boot, 1500); });
  }
  $('copy').addEventListener('click', copyCommand);
  $('advise-btn').addEventListener('click', runAdvise);
  $('fit-btn').addEventListener('click', runFit);
  $('fit-seq-btn').addEventListener('click', runFitSeq);
  $('picker').addEventListener('submit', function (ev) {
    ev.preventDefault();
    var typed = $('model-path').value.trim();
    switchModel(typed || $('model-pick').value);
  });
  $('model-pick').addEventListener('change', function () { $('model-path').value = ''; switchModel($('model-pick').value); });
  $('details').addEventListener('toggle', function (ev) { if (ev.target.id === 'choices') S.choicesOpen = ev.target.open; }, true);
  window.addEventListener('hashchange', onHashChange);
  boot();
})();
