"""algorithms/fedbnr_personal"""
